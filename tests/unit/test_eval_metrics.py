"""Ranking metrics on rankings small enough to score by hand."""

from __future__ import annotations

import math

import pytest

from pgembed.search import evaluate

LOG2_3 = math.log2(3)


def test_metric_definitions_by_hand() -> None:
    ranking = ["a", "b", "c"]
    judged = {"b": 2, "c": 1, "z": 3}
    dcg = 2 / LOG2_3 + 1 / 2
    ideal = 3 + 2 / LOG2_3 + 1 / 2
    assert evaluate.ndcg_at_k(ranking, judged, 3) == pytest.approx(dcg / ideal)
    assert evaluate.recall_at_k(ranking, judged, 3) == pytest.approx(2 / 3)
    assert evaluate.mrr_at_k(ranking, judged, 3) == pytest.approx(1 / 2)
    assert (evaluate.ndcg_at_k(ranking, judged, 1), evaluate.mrr_at_k(ranking, judged, 1)) == (0, 0)
    assert evaluate.recall_at_k(ranking, {"a": 0}, 3) == 0.0
