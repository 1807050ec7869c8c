"""Torch's threads while a local write-back runs beside a pipeline's encode (encode/sharing.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from pgembed.encode import sharing


@pytest.fixture(autouse=True)
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_a_pipelines_encode_beside_a_write_back_leaves_a_core_and_gets_it_back() -> None:
    with sharing.pipeline_encodes():
        sharing.fit()
        assert torch.get_num_threads() == 2
        with sharing.database_working():
            sharing.fit()
            assert torch.get_num_threads() == 1
            sharing.fit()  # the next batch of the same write-back: lowered once, not twice
            assert torch.get_num_threads() == 1
        sharing.fit()
        assert torch.get_num_threads() == 2


def test_a_drain_that_ends_lowered_gets_its_count_back() -> None:
    with sharing.pipeline_encodes(), sharing.database_working():
        sharing.fit()
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


def test_other_threads_keep_their_count() -> None:
    """A query encoded on another thread of the process (a web app running the sync in a
    thread) is not slowed, and cannot undo the pipeline thread's state."""
    seen: list[int] = []

    def query_thread() -> None:
        torch.set_num_threads(2)
        sharing.fit()
        seen.append(torch.get_num_threads())

    with sharing.pipeline_encodes(), sharing.database_working():
        sharing.fit()
        other = threading.Thread(target=query_thread)
        other.start()
        other.join()
        assert torch.get_num_threads() == 1
    assert seen == [2]
    assert torch.get_num_threads() == 2


def test_one_thread_stays_one() -> None:
    torch.set_num_threads(1)
    with sharing.pipeline_encodes(), sharing.database_working():
        sharing.fit()
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 1
