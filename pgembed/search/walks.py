"""Two walks for a model's unfiltered searches of 10 rows, measured by `pgembed tune`.

One walk wide enough for a target recall is wide for every query, though most of the rows a
narrow walk misses belong to the queries far from everything: their walk's rows are far from
them on average. So: a narrow first walk for every query, and a wide second one only for a query
whose first walk's 10 rows are at a mean cosine distance of a cutoff or more (the nearest row's
distance alone picks them worse). On a million review passages, first walks of 225 and a second
of 1000 for the 23 % of tune's queries past the cutoff gave recall@10 0.952 on other queries at a
median search of 9.2 ms against 19.3 for one walk of 541 (BENCHMARKS.md, "Search at scale").
The cutoff is a distance in the model's own space, different for each model and corpus, so it is
measured on the model's queries, never assumed. pgembed.search applies what is recorded
(pgembed/sql/definitions/30_search.sql, $second$).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psycopg

from pgembed.catalog.registry import ModelSpec
from pgembed.encode.embedder import Vectors
from pgembed.search import recall, topk

K = 10  # the searches two walks serve, and the k they are measured at
# First walks tried, up to half the one walk: two walks are kept only if they halve the walk of
# most searches. Never narrower than pgvector's default.
FIRSTS = (40, 60, 80, 100, 125, 150, 175, 200, 225, 250, 275, 300, 350, 400, 450, 500)
WIDEST = 1000  # pgvector's largest ef_search: a second walk tried beside the one walk's
# At most this share of the queries may walk twice, so that the median search walks once.
MOST_TWICE = 1 / 3


@dataclass(frozen=True)
class TwoWalks:
    first: int  # ef_search of every query's walk
    second: int  # ef_search of the second walk
    distance: float  # the second walk when the first one's rows are this far on average, or more
    recall: float  # recall@10 of the two, over the queries
    lower: float  # its 95 % lower bound
    twice: float  # the share of the queries that walked twice
    effort: float  # ef_search walked per query on average: first + twice * second


@dataclass(frozen=True)
class First:
    """Every query's first walk at one ef_search: its recall@10 and its rows' mean distance."""

    ef_search: int
    shares: Sequence[float]
    distances: Sequence[float]


def measure(
    conn: psycopg.Connection,
    spec: ModelSpec,
    vectors: Vectors,
    exact: list[list[str]],
    one_walk: int,
    target: float,
    floor: float,
) -> tuple[TwoWalks | None, TwoWalks | None]:
    """The two walks that meet `target` (95 % sure) and `floor` as the one walk of `one_walk`
    does, with the narrowest first walk (the median search's), walking less than it on average
    (None when there are none); and, when there are none but the target alone would let some
    be, those (what --allow-below-default would record). For a model one index answers (a
    chunked model's search merges two), with rows' exact top 10."""
    if spec.chunked or any(e and len(e) < K for e in exact):
        return None, None  # fewer than 10 rows: no walk is narrow
    keep = [i for i, e in enumerate(exact) if e]
    exact = [exact[i] for i in keep]

    def walked(ef: int) -> tuple[list[float], list[float]]:
        found = topk.nearest(conn, spec, vectors, K, ef)
        keys = [found[i][0] for i in keep]
        return recall.shares(keys, exact), [found[i][1] for i in keep]

    firsts = [First(ef, *walked(ef)) for ef in FIRSTS if ef <= one_walk // 2]
    if not firsts:
        return None, None
    seconds = {ef: walked(ef)[0] for ef in sorted({one_walk, WIDEST})}
    pair = choose(firsts, seconds, target, floor, one_walk)
    if pair is not None or floor <= 0:
        return pair, None
    return None, choose(firsts, seconds, target, 0.0, one_walk)


def choose(
    firsts: Sequence[First],
    seconds: Mapping[int, Sequence[float]],
    target: float,
    floor: float,
    one_walk: int,
) -> TwoWalks | None:
    """Of every (first, second) pair, the largest cutoff meeting the target and floor (a
    smaller one only walks more queries twice); of the pairs walking less than the one walk on
    average, the narrowest first walk, then the least mean effort."""
    found = [
        pair
        for first in firsts
        for second, shares in seconds.items()
        if second > first.ef_search
        and (pair := cutoff(first, second, shares, target, floor)) is not None
        and pair.effort < one_walk
    ]
    return min(found, key=lambda p: (p.first, p.effort), default=None)


def cutoff(
    first: First, second: int, shares: Sequence[float], target: float, floor: float
) -> TwoWalks | None:
    """The largest cutoff at which walking twice the queries past it meets the target and floor,
    if it leaves at most MOST_TWICE of them walking twice. Recorded halfway to the next query's
    distance, so that no query sits on it: the search's mean (PostgreSQL's avg of 1 - distance)
    may differ from this one in the last bit."""
    distances = sorted(set(first.distances), reverse=True)
    for distance, below in itertools.pairwise(distances):
        twice = [d >= distance for d in first.distances]
        share = sum(twice) / len(twice)
        if share > MOST_TWICE:
            return None
        mixed = [s if up else f for f, s, up in zip(first.shares, shares, twice, strict=True)]
        measured = recall.of(mixed)
        if not measured.meets(target, floor):
            continue
        return TwoWalks(
            first.ef_search,
            second,
            (distance + below) / 2,
            measured.mean,
            measured.lower,
            share,
            first.ef_search + share * second,
        )
    return None
