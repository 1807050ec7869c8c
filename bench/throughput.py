"""a-d: the hand-written pipeline, `pgembed sync --once`, bare encode, and the FLOP ceiling."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import psycopg
import torch
from pgvector.psycopg import register_vector
from psycopg import sql

from bench.env import Database, create_reviews, median, timed
from pgembed import capture, defaults
from pgembed.catalog import ddl, naming
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder, hardware
from pgembed.encode.settings import runtime_settings, settings_of
from pgembed.lifecycle import backfill, models, reindex
from pgembed.sync import worker

# all-MiniLM-L6-v2: 6 layers x (4*384*384 + 2*384*1536) multiply-adds = 21.2 MFLOP per token.
FLOP_PER_TOKEN = 21.2e6


@dataclass(frozen=True)
class Throughput:
    naive_rows_per_s: float
    naive_indexed_rows_per_s: float  # a, on a column with the HNSW index pgembed maintains
    sync_rows_per_s: float
    sync_unindexed_rows_per_s: float  # b without that index: what the index costs b
    backfill_rows_per_s: float  # `model add --backfill`: the rows, then the index built over them
    encode_rows_per_s: float
    mean_tokens: float
    precision: str
    peak_gflops: float
    ceiling_rows_per_s: float
    gpu_sync_rows_per_s: float | None = None  # b with --device cuda, when a GPU is present
    gpu_encode_rows_per_s: float | None = None  # c on the GPU


def naive_pipeline(database: Database, texts: list[str], repeats: int, indexed: bool) -> float:
    """What a user writes by hand: SentenceTransformer fp32 encode + executemany UPDATE.

    `indexed`: the column has the HNSW index a searchable column needs (pgembed keeps one).
    """
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(embedder.resolve("all-MiniLM-L6-v2"), device="cpu")
    conn = database.connect()
    table = "naive_indexed" if indexed else "naive"
    create_reviews(conn, texts, table)
    conn.execute(f"ALTER TABLE {table} ADD COLUMN embedding vector(384)")
    if indexed:
        conn.execute(
            f"CREATE INDEX {table}_embedding_idx ON {table} "
            "USING hnsw (embedding vector_cosine_ops)"
        )
    register_vector(conn)

    def run() -> float:
        if indexed:  # a backfill: an empty index each time (see _resyncs)
            conn.execute(f"UPDATE {table} SET embedding = NULL")
            conn.execute(f"REINDEX INDEX {table}_embedding_idx")
        started = time.perf_counter()
        rows = conn.execute(f"SELECT id, body FROM {table}").fetchall()
        vectors = model.encode([body for _, body in rows], batch_size=32)
        with conn.cursor() as cur:
            cur.executemany(
                f"UPDATE {table} SET embedding = %s WHERE id = %s",
                [(vec, key) for (key, _), vec in zip(rows, vectors, strict=True)],
            )
        return time.perf_counter() - started

    model.encode(texts[:64])  # warm-up, as for the others
    seconds = [run() for _ in range(repeats)]
    conn.close()
    return len(texts) / median(seconds)


def pgembed_sync(database: Database, texts: list[str], repeats: int) -> tuple[float, ModelSpec]:
    """`pgembed sync --once` end to end (claim, read, embed, write), model already loaded."""
    conn = database.connect()
    create_reviews(conn, texts)
    spec, _ = models.add(conn, models.AddRequest("minilm", "reviews", "body"))
    embedder.get(settings_of(spec)).encode_documents(texts[:64])  # load + warm-up

    seconds = [timed(lambda: _sync_once(database)), *_resyncs(conn, database, spec, repeats - 1)]
    written = conn.execute("SELECT count(embedding_minilm) FROM reviews").fetchone()
    assert written == (len(texts),), f"sync wrote {written} of {len(texts)} rows"
    conn.close()
    return len(texts) / median(seconds), spec


def sync_without_index(database: Database, spec: ModelSpec, repeats: int, rows: int) -> float:
    """b again with the model's HNSW index dropped (put back afterwards, for g)."""
    conn = database.connect()
    conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(naming.index_name(spec))))
    seconds = _resyncs(conn, database, spec, repeats)
    ddl.create_index(conn, spec)
    conn.close()
    return rows / median(seconds)


def backfill_then_index(database: Database, spec: ModelSpec, repeats: int, rows: int) -> float:
    """The same rows as `model add --backfill` embeds them: into the column without its index,
    which is built (concurrently) once they are all there; the build is timed too."""
    conn = database.connect()
    options = reindex.Options(claim_size=defaults.BACKFILL_CLAIM_SIZE)
    seconds = _repeated(
        conn, spec, repeats, backfill.Backfill(database.url, spec.name, options).run, _drop_index
    )
    assert conn.execute("SELECT count(embedding_minilm) FROM reviews").fetchone() == (rows,)
    conn.close()
    return rows / median(seconds)


def _sync_once(database: Database, device: str = "cpu") -> None:
    worker.Worker(database.url, worker.Options(once=True, device=device)).run()


def _resyncs(
    conn: psycopg.Connection, database: Database, spec: ModelSpec, repeats: int, device: str = "cpu"
) -> list[float]:
    """Seconds of `repeats` syncs, each of every row again (vectors cleared and requeued).

    Each starts from an empty index, as a backfill does: a repeat into the old index would write
    every vector beside its identical old one, which the graph search finds at once (a third of
    a first sync's insertion time, BENCHMARKS.md "b/c")."""
    return _repeated(conn, spec, repeats, lambda: _sync_once(database, device), _empty_index)


def _repeated(
    conn: psycopg.Connection,
    spec: ModelSpec,
    repeats: int,
    run: Callable[[], object],
    reset_index: Callable[[psycopg.Connection, ModelSpec], None],
) -> list[float]:
    """Seconds of `repeats` runs, each after every vector is cleared, the index reset and every
    row queued again (untimed)."""
    seconds = []
    for _ in range(repeats):
        conn.execute("UPDATE reviews SET embedding_minilm = NULL")
        reset_index(conn, spec)
        capture.enqueue_existing(conn, spec)
        seconds.append(timed(run))
    return seconds


def _drop_index(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """No index at all: what `model add --backfill` starts from."""
    conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(naming.index_name(spec))))


def _empty_index(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """Rebuild the model's HNSW index, if it has one, over a column now all NULL: empty."""
    name = naming.index_name(spec)
    if conn.execute("SELECT to_regclass(%s)", (name,)).fetchone() != (None,):
        conn.execute(sql.SQL("REINDEX INDEX {}").format(sql.Identifier(name)))


def on_gpu(
    database: Database, spec: ModelSpec, texts: list[str], repeats: int
) -> tuple[float, float]:
    """b and c with --device cuda: the model's GPU settings (its 16-bit type under auto)."""
    settings = runtime_settings(spec, "cuda")
    model = embedder.get(settings)
    model.encode_documents(texts[:64])  # load + warm-up
    encode = len(texts) / median(
        [timed(lambda: model.encode_documents(texts)) for _ in range(repeats)]
    )
    with database.connect() as conn:
        sync = len(texts) / median(_resyncs(conn, database, spec, repeats, "cuda"))
    return sync, encode


def bare_encode(spec: ModelSpec, texts: list[str], repeats: int) -> float:
    model = embedder.get(settings_of(spec))
    seconds = [timed(lambda: model.encode_documents(texts)) for _ in range(repeats)]
    return len(texts) / median(seconds)


def mean_tokens(spec: ModelSpec, texts: list[str]) -> float:
    counts = embedder.get(settings_of(spec)).token_counts(texts)
    return float(np.mean([min(c, spec.max_seq_length) for c in counts]))


def matmul_gflops(dtype: torch.dtype, size: int = 1536, repeats: int = 20) -> float:
    """This CPU's dense matrix-multiply speed, measured now (the ceiling's denominator)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.matmul(a, b)
    seconds = median([timed(lambda: torch.matmul(a, b)) for _ in range(repeats)])
    return 2 * size**3 / seconds / 1e9


def measure(database: Database, texts: list[str], repeats: int) -> Throughput:
    naive = naive_pipeline(database, texts, repeats, indexed=False)
    naive_indexed = naive_pipeline(database, texts, repeats, indexed=True)
    sync, spec = pgembed_sync(database, texts, repeats)
    unindexed = sync_without_index(database, spec, repeats, len(texts))
    backfilled = backfill_then_index(database, spec, repeats, len(texts))
    encode = bare_encode(spec, texts, repeats)
    tokens = mean_tokens(spec, texts)
    precision = str(getattr(spec, "precision", "fp32"))
    peak = matmul_gflops(torch.bfloat16 if precision == "bf16" else torch.float32)
    ceiling = peak * 1e9 / (FLOP_PER_TOKEN * tokens)
    gpu = on_gpu(database, spec, texts, repeats) if hardware.cuda_available() else (None, None)
    return Throughput(
        naive,
        naive_indexed,
        sync,
        unindexed,
        backfilled,
        encode,
        tokens,
        precision,
        peak,
        ceiling,
        *gpu,
    )
