"""g: search latency through pgembed's helper vs the raw statement; index recall vs exact."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import psycopg
from pgvector import Vector

from bench.env import Database, median, percentile
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of

RAW = "SELECT id FROM reviews ORDER BY embedding_minilm <=> %s LIMIT 10"
HELPER = "SELECT key FROM pgembed.search('minilm', %s, 10)"


@dataclass(frozen=True)
class Search:
    rows: int
    queries: int
    passes: int
    raw_p50_ms: float
    raw_p95_ms: float
    helper_p50_ms: float | None
    helper_p95_ms: float | None
    recall_at_10: float


PASSES = 4


def _latencies(
    conn: psycopg.Connection, statements: list[str], vectors: np.ndarray, passes: int = PASSES
) -> list[list[float]]:
    """Milliseconds per statement: passes over every query vector, the statements taking turns
    pass by pass (and in turn going first), so that the machine's drift over the run weighs on
    each alike and neither runs a vector whose index pages the other has just read."""
    out: list[list[float]] = [[] for _ in statements]
    for n in range(passes):
        for i in range(len(statements)) if n % 2 == 0 else reversed(range(len(statements))):
            for vec in vectors:
                started = time.perf_counter()
                conn.execute(statements[i], (Vector(vec),), prepare=True).fetchall()  # type: ignore[arg-type]
                out[i].append((time.perf_counter() - started) * 1000)
    return out


def _has_helper(conn: psycopg.Connection) -> bool:
    row = conn.execute("SELECT to_regprocedure('pgembed.search(text, vector, integer, jsonb)')")
    found = row.fetchone()
    return bool(found and found[0])


def measure(database: Database, spec: ModelSpec, queries: list[str]) -> Search:
    vectors = embedder.get(settings_of(spec)).encode_queries(queries)
    conn = database.connect()
    rows_row = conn.execute("SELECT count(embedding_minilm) FROM reviews").fetchone()
    rows = int(rows_row[0]) if rows_row else 0
    statements = [RAW, HELPER] if _has_helper(conn) else [RAW]
    _latencies(conn, statements, vectors[:10], passes=1)  # warm-up: prepare, cache the pages
    raw, *rest = _latencies(conn, statements, vectors)
    helper = rest[0] if rest else None
    hits = 0
    for vec in vectors:
        indexed = {r[0] for r in conn.execute(RAW, (Vector(vec),))}
        with conn.transaction():
            conn.execute("SET LOCAL enable_indexscan = off")
            exact = {r[0] for r in conn.execute(RAW, (Vector(vec),))}
        hits += len(indexed & exact)
    conn.close()
    return Search(
        rows=rows,
        queries=len(queries),
        passes=PASSES,
        raw_p50_ms=median(raw),
        raw_p95_ms=percentile(raw, 95),
        helper_p50_ms=median(helper) if helper else None,
        helper_p95_ms=percentile(helper, 95) if helper else None,
        recall_at_10=hits / (10 * len(queries)),
    )
