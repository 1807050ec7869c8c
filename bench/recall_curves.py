"""Which queries should `pgembed tune` measure recall with? The index's recall@10 against exact
search at each ef_search, for the real queries and for the stand-ins tune can make without them.

- "test queries": the real ones (with qrels), what the tuned index will serve;
- "excerpts": what `tune` uses without --queries (a run of 6-16 words of each of 200 rows);
- "stored vectors": what `tune` used before, 200 rows' own vectors (each excluding itself).

Also the test queries' nDCG@10 at each ef_search, which says what a chosen value costs.
"""

from __future__ import annotations

from statistics import fmean
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from pgembed.catalog import naming
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.embedder import Vectors
from pgembed.encode.settings import settings_of
from pgembed.search import evaluate, topk, tune

LADDER = (10, 20, 40, 60, 80, 100, 150, 200, 300, 400)
K = 10
SAMPLE = 200


def measure(
    conn: psycopg.Connection, spec: ModelSpec, queries: dict[str, str], qrels: evaluate.Qrels
) -> dict[str, Any]:
    ids = [q for q in qrels if q in queries]
    encoder = embedder.get(settings_of(spec))
    real = encoder.encode_queries([queries[q] for q in ids])
    keys, stored = stored_sample(conn, spec, SAMPLE)
    curves = {
        "test queries": _curve(conn, spec, real),
        "excerpts": _curve(conn, spec, encoder.encode_queries(tune.excerpts(conn, spec, SAMPLE))),
        "stored vectors": _curve(conn, spec, stored, keys),
    }
    ndcg = {ef: _ndcg(conn, spec, ids, real, qrels, ef) for ef in LADDER}
    return {"k": K, "recall": curves, "gap_to_test_queries": gaps(curves), "test_ndcg": ndcg}


def gaps(curves: dict[str, dict[int, float]]) -> dict[str, dict[str, float]]:
    """How far each curve is from the test queries', over the ef_search values all were measured
    at (stored vectors need k + 1 rows, so not at 10)."""
    common = set.intersection(*(set(curve) for curve in curves.values()))
    real = curves["test queries"]
    return {name: _gap(curve, real, common) for name, curve in curves.items()}


def _ndcg(
    conn: psycopg.Connection,
    spec: ModelSpec,
    ids: list[str],
    vectors: Vectors,
    qrels: evaluate.Qrels,
    ef: int,
) -> float:
    runs = topk.indexed(conn, spec, vectors, K, ef)
    return evaluate.score(dict(zip(ids, runs, strict=True)), qrels, K).ndcg


def _curve(
    conn: psycopg.Connection, spec: ModelSpec, vectors: Vectors, keys: list[str] | None = None
) -> dict[int, float]:
    fetch = K + 1 if keys else K  # a stored vector finds itself first: drop it
    exact = _without(keys, topk.exact(conn, spec, vectors, fetch))
    return {
        ef: evaluate.overlap(_without(keys, topk.indexed(conn, spec, vectors, fetch, ef)), exact)
        for ef in LADDER
        if ef >= fetch
    }


def _without(keys: list[str] | None, runs: list[list[str]]) -> list[list[str]]:
    if not keys:
        return runs
    return [[key for key in run if key != own][:K] for own, run in zip(keys, runs, strict=True)]


def _gap(curve: dict[int, float], real: dict[int, float], at: set[int]) -> dict[str, float]:
    diffs = [abs(curve[ef] - real[ef]) for ef in sorted(at)]
    return {"mean_abs": fmean(diffs), "max_abs": max(diffs)}


def stored_sample(conn: psycopg.Connection, spec: ModelSpec, n: int) -> tuple[list[str], Vectors]:
    """Up to n stored vectors with their keys, a fixed pseudo-random choice (by md5 of the key)."""
    rows = conn.execute(
        sql.SQL(
            "SELECT {key}::text, {col} FROM {table} WHERE {col} IS NOT NULL "
            "ORDER BY pg_catalog.md5({key}::pg_catalog.text) LIMIT %s"
        ).format(
            key=sql.Identifier(spec.key_column),
            col=sql.Identifier(spec.embedding_column),
            table=naming.table(spec),
        ),
        (n,),
    ).fetchall()
    if not rows:
        return [], np.empty((0, spec.dimensions), np.float32)
    return [key for key, _ in rows], np.stack([v.to_numpy() for _, v in rows])
