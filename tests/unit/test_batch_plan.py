"""Length-sorted encode batches: the plan alone, without a model."""

from __future__ import annotations

import pytest

from pgembed.encode import batches


def test_plan_covers_every_text_once_longest_first() -> None:
    lengths = [5, 40, 12, 40, 7, 33, 9]
    planned = batches.plan(lengths, 3)
    assert sorted(int(i) for b in planned for i in b) == list(range(len(lengths)))
    assert [len(b) for b in planned] == [3, 3, 1]
    assert [lengths[int(i)] for b in planned for i in b] == sorted(lengths, reverse=True)
    with pytest.raises(ValueError):
        batches.plan(lengths, 0)
