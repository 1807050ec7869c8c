"""Plans alone, without a model or a database: length-sorted encode batches, and what each
slice of a write-back writes, completes and postpones (sync/batch.py's plan_slice)."""

from __future__ import annotations

import numpy as np
import pytest

from pgembed.encode import batches
from pgembed.sync.batch import Rows, plan_slice, to_lock
from pgembed.sync.isolate import Embedded
from pgembed.sync.store import Claim, Locked, SourceRow


def test_plan_covers_every_text_once_longest_first() -> None:
    lengths = [5, 40, 12, 40, 7, 33, 9]
    planned = batches.plan(lengths, 3)
    assert sorted(int(i) for b in planned for i in b) == list(range(len(lengths)))
    assert [len(b) for b in planned] == [3, 3, 1]
    assert [lengths[int(i)] for b in planned for i in b] == sorted(lengths, reverse=True)
    with pytest.raises(ValueError):
        batches.plan(lengths, 0)


def test_a_write_back_slice_is_planned_from_what_its_lock_found() -> None:
    """A slice of six claims: rows 1-5 embedded (6 failed); the lock found 1 and 4 unchanged, 2
    changed since the read, 3 gone and 5 held by another transaction."""
    claims = [Claim(str(k), seq=k, attempts=0) for k in range(1, 7)]
    embedded = Embedded(
        rows=[SourceRow(str(k), f"text {k}", f"m{k}") for k in range(1, 6)],
        vectors=[np.arange(10, dtype=np.float32).reshape(5, 2)],
        failed=[(SourceRow("6", "text 6", "m6"), "ValueError: no")],
    )
    rows = Rows.of(embedded)
    assert to_lock(claims, rows) == (list("12345"), [f"m{k}" for k in range(1, 6)])
    plan = plan_slice(
        claims,
        rows,
        to_lock(claims, rows),
        Locked(same={"1": True, "2": False, "4": True}, held={"5"}),
    )
    assert (plan.keys, plan.md5s, plan.positions) == (["1", "4"], ["m1", "m4"], [0, 3])
    assert rows.matrix[plan.positions].tolist() == [[0, 1], [6, 7]]
    # Completed: written, changed (queued again by its update) or gone; not the failed key 6,
    # whose attempt is recorded, nor the held key 5, postponed.
    assert [c.key for c in plan.complete] == list("1234")
    assert [c.key for c in plan.busy] == ["5"]
    assert plan.settled == set("12345")


def test_a_slice_whose_rows_are_all_held_writes_nothing() -> None:
    claims = [Claim("a", 1, 0), Claim("b", 2, 0)]
    rows = Rows.of(
        Embedded(
            [SourceRow("a", "x", "ma"), SourceRow("b", "y", "mb")], [np.eye(2, dtype=np.float32)]
        )
    )
    plan = plan_slice(claims, rows, to_lock(claims, rows), Locked(same={}, held={"a", "b"}))
    assert (plan.keys, plan.positions, plan.complete) == ([], [], [])
    assert [c.key for c in plan.busy] == ["a", "b"]
