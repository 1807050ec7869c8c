"""`pgembed tune`: the smallest hnsw.ef_search whose results agree enough with exact search.

Recall here is the index's recall@k against exact search (not against human judgements), on a
sample of queries: given query texts, or stored vectors used as queries (each excluding itself).
The value found is recorded as the model's `ef_search`, which pgembed's searches then apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

from pgembed import sqlfiles
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.errors import NotFoundError, UsageError
from pgembed.lifecycle import models
from pgembed.search import evaluate, topk

# pgvector accepts 1..1000; the default is 40.
LADDER = (10, 20, 40, 60, 80, 100, 150, 200, 300, 400, 500, 600, 800, 1000)


@dataclass(frozen=True)
class Step:
    ef_search: int
    recall: float


@dataclass(frozen=True)
class Tuning:
    model: str
    k: int
    target: float
    sample: int  # queries used
    ef_search: int  # recorded
    recall: float  # at the recorded ef_search
    reached: bool  # False: even the largest ef_search missed the target (it is recorded anyway)
    steps: tuple[Step, ...]


def tune(
    conn: psycopg.Connection,
    spec: ModelSpec,
    target: float = 0.95,
    k: int = 10,
    queries: Sequence[str] = (),
    sample: int = 200,
) -> Tuning:
    """Try the ladder from the bottom until recall@k against exact search reaches `target`."""
    if not 0 < target <= 1:
        raise UsageError("--target-recall must be in (0, 1]")
    if k < 1 or sample < 1:
        raise UsageError("-k and --sample must be at least 1")
    if queries:
        keys: list[str] = []
        vectors = embedder.get(models.settings_of(spec)).encode_queries(list(queries[:sample]))
    else:
        keys, vectors = topk.stored_sample(conn, spec, sample)
    if len(vectors) == 0:
        raise NotFoundError(f"model {spec.name!r} has no vectors yet: run `pgembed sync`")
    fetch = k + 1 if keys else k  # a stored vector finds itself first: drop it
    exact = _without(keys, topk.exact(conn, spec, vectors, fetch), k)
    steps: list[Step] = []
    for ef in (ef for ef in LADDER if ef >= fetch):
        found = _without(keys, topk.indexed(conn, spec, vectors, fetch, ef), k)
        steps.append(Step(ef, evaluate.overlap(found, exact)))
        if steps[-1].recall >= target:
            break
    best = steps[-1]
    record(conn, spec.name, best.ef_search)
    return Tuning(
        model=spec.name,
        k=k,
        target=target,
        sample=len(vectors),
        ef_search=best.ef_search,
        recall=best.recall,
        reached=best.recall >= target,
        steps=tuple(steps),
    )


def _without(keys: Sequence[str], runs: list[list[str]], k: int) -> list[list[str]]:
    if not keys:
        return runs
    return [[key for key in run if key != own][:k] for own, run in zip(keys, runs, strict=True)]


def record(conn: psycopg.Connection, name: str, ef_search: int | None) -> None:
    conn.execute(sqlfiles.get("catalog", "set_ef_search"), {"ef_search": ef_search, "name": name})
