"""Torch's threads give a core back while PostgreSQL works for the sync on the same machine.

The sync writes batch n-1 while batch n encodes (sync/pipeline.py). The write-back's HNSW
insertions take a core of a local server for a few hundred milliseconds; torch's intra-op
threads, one per core, then wait for each other at every operation while one of them has no
core. One thread fewer for the encodes that overlap a write-back made 2,000-row syncs 1.10-1.17x
faster with bf16 on 2 cores, 1.03x with fp32 (BENCHMARKS.md, "A core for a local write-back").
A server on another machine takes no core here, so the pipeline only yields for a local one.
onnxruntime's sessions fix their threads when made, and one fewer measured no faster (1.02x):
they keep theirs.

Only a thread that encodes a pipeline's batches takes part (`pipeline_encodes`): torch's count
(OpenMP's, in the Linux wheels) belongs to the thread that sets it, and a query encoded on
another thread of the same process keeps its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_working = 0  # write-backs in flight to a local server, from any pipeline of the process
_thread = threading.local()  # .encoding: the thread takes part; .lowered_from: its full count


@contextmanager
def database_working() -> Iterator[None]:
    """While this runs, the pipelines' encodes leave a core to the database (see `fit`)."""
    global _working
    with _lock:
        _working += 1
    try:
        yield
    finally:
        with _lock:
            _working -= 1


@contextmanager
def pipeline_encodes() -> Iterator[None]:
    """The calling thread encodes a pipeline's batches: `fit` applies to it until the end, when
    its count is restored."""
    _thread.encoding = True
    try:
        yield
    finally:
        _thread.encoding = False
        _restore()


def fit() -> None:
    """Before an encode: on a pipeline's thread, one thread fewer while a local write-back runs
    and the count as it was otherwise. torch is imported here, not at the top: a cold query
    loads no torch."""
    if not getattr(_thread, "encoding", False):
        return
    import torch

    if _working and getattr(_thread, "lowered_from", None) is None:
        threads = torch.get_num_threads()
        if threads > 1:
            torch.set_num_threads(threads - 1)
            _thread.lowered_from = threads
    elif not _working:
        _restore()


def _restore() -> None:
    lowered = getattr(_thread, "lowered_from", None)
    if lowered is not None:
        import torch

        torch.set_num_threads(lowered)
        _thread.lowered_from = None
