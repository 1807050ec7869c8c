"""Recall@k against exact search over a sample of queries: its mean and a 95 % lower bound."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

Z_95 = 1.645  # one-sided 95 % normal quantile


@dataclass(frozen=True)
class Recall:
    mean: float
    lower: float  # 95 % lower confidence bound of the mean: what must reach a target

    def meets(self, target: float, floor: float) -> bool:
        """Sure enough of `target`, and never below `floor` (the recall without tuning)."""
        return self.lower >= target and self.mean >= floor


def shares(found: Sequence[Sequence[str]], exact: Sequence[Sequence[str]]) -> list[float]:
    """Per query with an exact answer: the share of its exact top k that was found."""
    return [len(set(f) & set(e)) / len(e) for f, e in zip(found, exact, strict=True) if e]


def of(per_query: Sequence[float]) -> Recall:
    if not per_query:
        return Recall(1.0, 1.0)
    mean = statistics.fmean(per_query)
    n = len(per_query)
    error = statistics.stdev(per_query) / math.sqrt(n) if n > 1 else 0.0
    return Recall(mean, mean - Z_95 * error)
