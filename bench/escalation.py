"""Per-query effort on the 1M table: one narrow HNSW walk, and a second, wide one only for the
queries whose hits are far (cosine distance at or past a cutoff).

`python -m bench.escalation --database-url URL --corpus reviews.csv.gz --scale-cache DIR`, after
`python -m bench --only searchscale` built `scale_1m` on that server (same URL and cache). Not
part of `make bench`: the measurements behind `pgembed tune`'s two walks (search/walks.py;
BENCHMARKS.md, "Search at scale", "One effort for every query").

Raw SQL walks (strict order, no filter) of every query at each ef_search in `--efforts`, timed
on a warm index (the second of two passes). Two sets of queries, neither rows of the table:
the benchmark's own 50 (the first 200 characters of each held-out review) and, to choose the
cutoff on, up to 4 other runs of 150 to 200 characters of each held-out review (from a sentence
start past the first 200 characters; embedded once, cached beside the passages). For each
(first, second) pair of efforts the cutoff is the largest whose recall@10 on the choosing queries
reaches 0.955 (a larger one walks fewer queries twice); its recall and latency are then read on
the benchmark's queries. The two sets are not independent: other passages of the same reviews.
A query's latency is its first walk's time, plus its second walk's when it escalates (the two
measured apart). Last, which feature of the first walk picks the queries to walk twice: for each
first walk up to 300 and a second of the widest effort, the share of the choosing queries that
must walk twice for `pgembed tune`'s rule (recall@10 0.95, 95 % sure), the farthest first by the
nearest row's distance or by the mean distance of the walk's 10 rows (what pgembed uses).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psycopg
from pgvector import Vector
from pgvector.psycopg import register_vector

from bench import searchscale
from bench.env import file_corpus
from pgembed import defaults
from pgembed.encode import embedder
from pgembed.search.recall import of as recall_of

TABLE, TARGET = "scale_1m", 0.955
WALK = (
    "SELECT id, embedding_scale_1m OPERATOR(public.<=>) %s FROM scale_1m "
    "ORDER BY embedding_scale_1m OPERATOR(public.<=>) %s LIMIT 10"
)


@dataclass
class Walks:
    """Per query: recall@10 and nearest distance at each effort, and the walk's ms."""

    recall: dict[int, np.ndarray]
    nearest: dict[int, np.ndarray]
    ms: dict[int, np.ndarray]
    mean: dict[int, np.ndarray] = field(default_factory=dict)  # the walk's 10 rows' distance


def walk_all(conn: psycopg.Connection, queries: np.ndarray, efforts: list[int]) -> Walks:
    qs = [Vector(q) for q in queries]
    with conn.transaction():
        conn.execute("SET LOCAL enable_indexscan = off")  # exact: a scan of every row
        truth = [{r[0] for r in conn.execute(WALK, (q, q), prepare=False)} for q in qs]
    walks = Walks({}, {}, {})
    for rep in range(2):  # the first pass warms the index pages each effort reads
        for ef in efforts:
            conn.execute(f"SET hnsw.ef_search = {int(ef)}")
            found, ms = [], []
            for q in qs:
                started = time.perf_counter()
                found.append(conn.execute(WALK, (q, q)).fetchall())
                ms.append((time.perf_counter() - started) * 1000)
            walks.ms[ef] = np.array(ms)
            if rep == 0:
                pairs = zip(found, truth, strict=True)
                walks.recall[ef] = np.array([len({r[0] for r in f} & t) / 10 for f, t in pairs])
                walks.nearest[ef] = np.array([rows[0][1] for rows in found])
                walks.mean[ef] = np.array([np.mean([r[1] for r in rows]) for rows in found])
    conn.execute("RESET hnsw.ef_search")
    return walks


@dataclass
class Policy:
    first: int
    second: int
    cutoff: float


def outcome(walks: Walks, policy: Policy) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per query: escalated?, recall, ms."""
    up = walks.nearest[policy.first] >= policy.cutoff
    recall = np.where(up, walks.recall[policy.second], walks.recall[policy.first])
    ms = walks.ms[policy.first] + np.where(up, walks.ms[policy.second], 0.0)
    return up, recall, ms


def choose(walks: Walks, first: int, second: int) -> Policy | None:
    """The largest cutoff whose mean recall reaches TARGET: each smaller one walks more queries
    twice, which never makes any query faster."""
    for cutoff in np.unique(walks.nearest[first])[::-1]:
        policy = Policy(first, second, float(cutoff))
        if outcome(walks, policy)[1].mean() >= TARGET:
            return policy
    return None


def twice_needed(walks: Walks, first: int, second: int, distances: np.ndarray) -> float | None:
    """The share of the queries that must walk twice, the farthest by `distances` first, for
    recall@10 to reach 0.95 95 % sure (`pgembed tune`'s rule); None if all of them is not enough."""
    order = np.argsort(-distances, kind="stable")
    for n in range(len(order) + 1):
        up = np.zeros(len(order), dtype=bool)
        up[order[:n]] = True
        mixed = np.where(up, walks.recall[second], walks.recall[first])
        if recall_of(list(mixed)).lower >= 0.95:
            return n / len(order)
    return None


def choosing_vectors(corpus: Path, cache: Path, precision: str) -> np.ndarray:
    """The choosing queries' vectors, embedded once (cached): run to run, bf16 on another
    batch could move a query's vector, and the cutoff with it."""
    path = cache / "escalation-choosing.npy"
    if path.exists():
        return np.load(path)
    held_out = file_corpus(corpus, 10**9)[-searchscale.QUERIES :]
    encoder = embedder.get(embedder.Settings(model_ref=defaults.MODEL, precision=precision))
    vectors = encoder.encode_queries(searchscale.tuning_texts(held_out))
    np.save(path, vectors)
    return vectors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="the searchscale server")
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--scale-cache", type=Path, required=True)
    parser.add_argument("--efforts", default="40,80,120,160,200,225,240,250,320,541,1000")
    args = parser.parse_args()
    efforts = [int(e) for e in args.efforts.split(",")]
    _, bench_queries, precision = searchscale.vectors(args.corpus, args.scale_cache)
    choosing = choosing_vectors(args.corpus, args.scale_cache, precision)
    url = searchscale.database_url(args.database_url)
    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        for q in bench_queries[:10]:  # warm up
            conn.execute(WALK, (Vector(q), Vector(q))).fetchall()
        on_bench = walk_all(conn, bench_queries, efforts)
        on_choosing = walk_all(conn, choosing, efforts)
    print(f"{len(bench_queries)} benchmark queries, {len(choosing)} to choose the cutoff on\n")
    print("| ef_search | recall@10 | p50 / p95 / mean ms | queries finding ≤ 8 of 10 |")
    print("| --- | --- | --- | --- |")
    for ef in efforts:
        ms = on_bench.ms[ef]
        print(
            f"| {ef} | {on_bench.recall[ef].mean():.3f} | {np.median(ms):.1f} / "
            f"{np.percentile(ms, 95):.1f} / {ms.mean():.1f} | "
            f"{int((on_bench.recall[ef] <= 0.8).sum())} |"
        )
    print(
        "\n| first / second ef_search | cutoff (cosine distance) | chosen on: recall, p50 ms |"
        " benchmark queries: recall@10 | p50 / p95 / mean ms | escalated |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for first in efforts:
        for second in (e for e in efforts if e > first and e >= 541):
            policy = choose(on_choosing, first, second)
            if policy is None:
                continue
            _, c_recall, c_ms = outcome(on_choosing, policy)
            up, recall, ms = outcome(on_bench, policy)
            print(
                f"| {first} / {second} | {policy.cutoff:.3f} | {c_recall.mean():.3f}, "
                f"{np.median(c_ms):.1f} | {recall.mean():.3f} | {np.median(ms):.1f} / "
                f"{np.percentile(ms, 95):.1f} / {ms.mean():.1f} | {up.mean():.0%} |"
            )
    widest = max(efforts)
    print(
        f"\nWhich queries walk twice: the share of the choosing queries that must (a second walk "
        f"of {widest}) for recall@10 0.95, 95 % sure, picked by their first walk's\n"
    )
    print("| first ef_search | nearest row's distance | mean distance of its 10 rows |")
    print("| --- | --- | --- |")
    for first in (e for e in efforts if e <= 300):
        shares = [
            twice_needed(on_choosing, first, widest, by[first])
            for by in (on_choosing.nearest, on_choosing.mean)
        ]
        print(f"| {first} | " + " | ".join("-" if s is None else f"{s:.0%}" for s in shares) + " |")


if __name__ == "__main__":
    main()
