"""HNSW insertions or one build: what the server spends to index a filled column either way.

`python -m bench.hnswcost [--rows N ...] [--database-url URL]`: real all-MiniLM-L6-v2 vectors of
the generated review texts (bf16 where native, as `auto` picks), written in batches of 250 as a
sync's write-backs are: into a column with an empty HNSW index (as `model add` leaves it), and
into a bare column followed by `CREATE INDEX CONCURRENTLY` (as `model add --backfill` does).
Server time only: nothing encodes while it is timed. Prints a Markdown table; not part of
`make bench` (BENCHMARKS.md, "HNSW insertions or one build").
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import psycopg
from pgvector import Vector

from bench.env import Database, create_reviews, generated_corpus, median, server
from pgembed import defaults
from pgembed.encode import embedder

BATCH = 250


def vectors(texts: list[str]) -> np.ndarray:
    settings = embedder.Settings(defaults.MODEL, precision="bf16")
    return embedder.get(settings).encode_documents(texts)


def write_all(conn: psycopg.Connection, embeddings: np.ndarray) -> float:
    """Seconds to write every vector, a batch of BATCH keys per transaction."""
    started = time.perf_counter()
    for low in range(0, len(embeddings), BATCH):
        keys = list(range(low, min(low + BATCH, len(embeddings))))
        with conn.transaction(), conn.cursor(binary=True) as cur:
            cur.execute(
                "UPDATE reviews t SET embedding = v.e FROM ROWS FROM "
                "(unnest(%s::int[]), unnest(%b)) v(k, e) WHERE t.id = v.k",
                (keys, [Vector(embeddings[k]) for k in keys]),
            )
    return time.perf_counter() - started


def once(database: Database, texts: list[str], embeddings: np.ndarray, build_after: bool) -> float:
    conn = database.connect()
    create_reviews(conn, texts)
    conn.execute("ALTER TABLE reviews ADD COLUMN embedding vector(384)")
    index = "CREATE INDEX {} reviews_hnsw ON reviews USING hnsw (embedding vector_cosine_ops)"
    if not build_after:
        conn.execute(index.format(""))
    conn.execute(f"SET maintenance_work_mem = '{defaults.MAINTENANCE_WORK_MEM}'")
    conn.execute("CHECKPOINT")
    seconds = write_all(conn, embeddings)
    if build_after:
        started = time.perf_counter()
        conn.execute(index.format("CONCURRENTLY"))
        seconds += time.perf_counter() - started
    conn.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[2_000, 20_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--database-url", help="default: a temporary embedded server")
    args = parser.parse_args()
    print("| rows | into the index (s) | bare column, then built (s) | ratio |")
    print("| ---: | ---: | ---: | ---: |")
    with server(args.database_url) as url:
        database = Database(url)
        try:
            for rows in args.rows:
                texts = generated_corpus(rows)
                embeddings = vectors(texts)
                inserted, built = [], []
                for _ in range(args.repeats):  # taking turns
                    inserted.append(once(database, texts, embeddings, build_after=False))
                    built.append(once(database, texts, embeddings, build_after=True))
                a, b = median(inserted), median(built)
                print(f"| {rows:,} | {a:.2f} | {b:.2f} | {a / b:.2f} |", flush=True)
        finally:
            database.drop()


if __name__ == "__main__":
    main()
