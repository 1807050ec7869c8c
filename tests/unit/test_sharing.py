"""Torch's threads while a local write-back runs beside the encode (encode/sharing.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from pgembed.encode import sharing


@pytest.fixture(autouse=True)
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    sharing.restore()
    torch.set_num_threads(before)


def test_an_encode_beside_a_write_back_leaves_a_core_and_gets_it_back() -> None:
    torch.set_num_threads(2)
    sharing.fit()
    assert torch.get_num_threads() == 2
    with sharing.database_working():
        sharing.fit()
        assert torch.get_num_threads() == 1
        sharing.fit()  # the next batch of the same write-back: lowered once, not twice
        assert torch.get_num_threads() == 1
    sharing.fit()
    assert torch.get_num_threads() == 2


def test_a_drain_that_ends_lowered_restores_the_count() -> None:
    torch.set_num_threads(3)
    with sharing.database_working():
        sharing.fit()
        assert torch.get_num_threads() == 2
    sharing.restore()
    assert torch.get_num_threads() == 3
    sharing.restore()  # nothing lowered: nothing changes
    assert torch.get_num_threads() == 3


def test_one_thread_stays_one_and_the_applications_own_count_is_kept() -> None:
    torch.set_num_threads(1)
    with sharing.database_working():
        sharing.fit()
        assert torch.get_num_threads() == 1
    sharing.fit()
    torch.set_num_threads(2)  # the application's choice, made while nothing was lowered
    sharing.fit()
    assert torch.get_num_threads() == 2
