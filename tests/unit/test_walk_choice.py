"""search/walks.py's choice of two walks from measured per-query recalls and distances."""

from __future__ import annotations

from pytest import approx

from pgembed.search import walks

# Ten queries. A first walk of 40 finds all of the 7 near ones' rows and half of the 3 far ones'
# (their rows at a mean distance of 0.5 or more); a second walk of 1000 finds every row.
DISTANCES = [0.1, 0.2, 0.2, 0.3, 0.3, 0.35, 0.4, 0.5, 0.6, 0.7]
FIRST = walks.First(40, [1.0] * 7 + [0.5] * 3, DISTANCES)
SECOND = {1000: [1.0] * 10}


def test_the_largest_cutoff_that_meets_the_target() -> None:
    pair = walks.choose([FIRST], SECOND, 0.9, 0.0, one_walk=600)
    assert pair is not None
    # 0.5 walks the 3 far queries twice: recall 1.0. At 0.6 one far query keeps 0.5, and the
    # 95 % lower bound of the mean (0.95) is 0.868, below the target. Recorded halfway to the
    # next distance, 0.4, so that no query sits on it.
    assert (pair.first, pair.second) == (40, 1000) and pair.distance == approx(0.45)
    assert pair.recall == 1.0 and pair.twice == 0.3 and pair.effort == 40 + 0.3 * 1000


def test_one_walk_is_kept_when_two_walk_more_or_walk_most_queries_twice() -> None:
    assert walks.choose([FIRST], SECOND, 0.9, 0.0, one_walk=340) is None  # 40 + 300 on average
    wide = walks.First(40, [0.5] * 10, DISTANCES)  # every query needs the second walk
    assert walks.choose([wide], SECOND, 0.9, 0.0, one_walk=10_000) is None


def test_the_floor_then_the_narrowest_first_walk() -> None:
    # A low target: cutoff 0.7 (recall 0.9; recorded 0.65) will do; the floor (the default's
    # recall) 0.99 asks for 0.5 (recall 1.0).
    low = walks.choose([FIRST], SECOND, 0.5, 0.0, one_walk=600)
    floored = walks.choose([FIRST], SECOND, 0.5, 0.99, one_walk=600)
    assert low is not None and floored is not None
    assert low.distance == approx(0.65) and floored.distance == approx(0.45)
    # The narrowest first walk wins (the median search's), though a wider one walks less on
    # average: 80 + 0.1 * 1000 = 180 against 340.
    wider = walks.First(80, [1.0] * 9 + [0.5], DISTANCES)
    pair = walks.choose([FIRST, wider], SECOND, 0.9, 0.0, one_walk=600)
    assert pair is not None and pair.first == 40 and pair.distance == approx(0.45)
    # Of two seconds for one first walk, the one walking less on average.
    both = walks.choose([wider], {**SECOND, 600: [1.0] * 10}, 0.9, 0.0, one_walk=700)
    assert both is not None and (both.second, both.effort) == (600, 80 + 0.1 * 600)
    # A second walk no wider than the first is never paired with it.
    assert walks.choose([wider], {60: [1.0] * 10}, 0.9, 0.0, one_walk=600) is None
