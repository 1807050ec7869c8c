"""What `model add`, `model alter` (a reindex's start and abort), `reindex --index-only` and
`model remove` cost an application writing every 20 ms, on a table of real IMDB reviews.

python -m bench.modelsetup --rows 100000 [--corpus reviews.csv.gz] [--database-url URL]
                           [--no-index-build]

The table holds the corpus's reviews repeated to `--rows`. No text is embedded: the rebuilt index
is over derived vectors (each row's is a fixed random unit vector of its review, plus noise), so
its size and build time are those of real 384-dimension vectors. The writer is a process of its
own (tests/app_writer.py); its slowest commit is reported for each command.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
from pgvector import Vector

from bench.env import Database, file_corpus, server
from pgembed import db
from pgembed.catalog import registry
from pgembed.encode import embedder
from pgembed.lifecycle import indexbuild, models, reindex, setup
from tests.app_writer import Writer

DEFAULT_CORPUS = Path("/work/shared/data/imdb-reviews/reviews.csv.gz")


class Steps(setup.Reporter):
    """Times each step of a setup."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.marks: list[tuple[str, float]] = []

    def step(self, text: str) -> None:
        self.marks.append((text, time.monotonic() - self.started))


def _load(conn: psycopg.Connection, texts: list[str], rows: int) -> None:
    conn.execute("CREATE TABLE public.docs (id bigint PRIMARY KEY, body text)")
    with conn.cursor() as cur, cur.copy("COPY public.docs (id, body) FROM STDIN") as copy:
        for i in range(rows):
            copy.write_row((i + 1, texts[i % len(texts)]))
    conn.execute("ANALYZE public.docs")


def _derived_vectors(conn: psycopg.Connection, texts: int, rows: int) -> None:
    """Every row's vector, written as the sync worker writes (no capture), then analysed."""
    rng = np.random.default_rng(5)
    base = rng.normal(size=(texts, 384)).astype(np.float32)
    conn.execute("CREATE TEMP TABLE v (id bigint, e vector(384))")
    with conn.cursor() as cur, cur.copy("COPY v (id, e) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["bigint", "vector"])
        for i in range(rows):
            vector = base[i % texts] + rng.normal(scale=0.05, size=384).astype(np.float32)
            copy.write_row((i + 1, Vector(vector / np.linalg.norm(vector))))
    # Without the index (100,000 HNSW insertions would take the UPDATE minutes): the rebuild
    # below makes it again, and the live index's absence is what a --backfill model starts with.
    conn.execute("DROP INDEX public.pgembed_minilm_hnsw")
    with conn.transaction():
        conn.execute("SET LOCAL pgembed.writing = 'on'")
        conn.execute("UPDATE public.docs d SET embedding_minilm = v.e FROM v WHERE v.id = d.id")
    conn.execute("DELETE FROM pgembed.queue")
    conn.execute("DELETE FROM pgembed.inbox")
    conn.execute("VACUUM ANALYZE public.docs")


def _timed_with_writer(url: str, first_id: int, work: Callable[[], object]) -> tuple[float, float]:
    with Writer(url, first_id) as writer:
        time.sleep(0.5)
        started = time.monotonic()
        work()
        took = time.monotonic() - started
        time.sleep(0.5)
    return took, writer.longest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.modelsetup")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--database-url")
    parser.add_argument(
        "--no-index-build", action="store_true", help="skip the vectors and the index rebuild"
    )
    args = parser.parse_args(argv)
    texts = file_corpus(args.corpus, 50_000)
    with server(args.database_url) as server_url:
        database = Database(server_url)
        try:
            url = database.url
            with db.connection(url) as conn:
                started = time.monotonic()
                _load(conn, texts, args.rows)
                print(f"loaded {args.rows} rows in {time.monotonic() - started:.0f} s", flush=True)
                models.load_checked(embedder.Settings("all-MiniLM-L6-v2"))  # not timed
                request = models.AddRequest("minilm", "docs", "body", precision="fp32")
                steps = Steps()
                took, longest = _timed_with_writer(
                    url,
                    10 * args.rows,
                    lambda: models.add(conn, request, url=url, reporter=steps),
                )
                print(f"model add: {took:.1f} s, writer's longest commit {longest:.3f} s")
                first = steps.marks[0][1] if steps.marks else 0.0
                for text, at in steps.marks:
                    print(f"  {at - first:6.1f} s  {text}")
                if not args.no_index_build:
                    _rebuild_index(conn, url, len(texts), args.rows)
                took, longest = _timed_with_writer(
                    url,
                    12 * args.rows,
                    lambda: reindex.begin(conn, "minilm", reindex.Change(pooling="cls")),
                )
                print(f"model alter (start): {took:.1f} s, writer's longest commit {longest:.3f} s")
                took, longest = _timed_with_writer(
                    url, 13 * args.rows, lambda: reindex.abort(conn, "minilm")
                )
                print(f"reindex --abort: {took:.1f} s, writer's longest commit {longest:.3f} s")
                took, longest = _timed_with_writer(
                    url, 14 * args.rows, lambda: models.remove(conn, "minilm")
                )
                print(f"model remove: {took:.1f} s, writer's longest commit {longest:.3f} s")
        finally:
            database.drop()
    return 0


def _rebuild_index(conn: psycopg.Connection, url: str, texts: int, rows: int) -> None:
    """`reindex --index-only` over derived vectors, with the writer."""
    _derived_vectors(conn, texts, rows)
    row = conn.execute("SELECT pg_size_pretty(pg_table_size('public.docs'))").fetchone()
    print(f"vectors written; table {row[0] if row else '?'}", flush=True)
    notes: list[str] = []
    settings = indexbuild.BuildSettings()
    chosen = indexbuild.memory_for(
        conn, registry.get(conn, "minilm"), settings, filled=True, say=notes.append
    )
    for note in notes:
        print(f"  hint: {note}")
    took, longest = _timed_with_writer(
        url,
        11 * rows,
        lambda: indexbuild.rebuild(url, "minilm", None, None, settings, None, None),
    )
    row = conn.execute(
        "SELECT pg_size_pretty(pg_relation_size('public.pgembed_minilm_hnsw'))"
    ).fetchone()
    print(
        f"reindex --index-only: {took:.1f} s (maintenance_work_mem {chosen}, index "
        f"{row[0] if row else '?'}), writer's longest commit {longest:.3f} s"
    )


if __name__ == "__main__":
    sys.exit(main())
