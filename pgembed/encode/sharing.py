"""Torch's threads give a core back while PostgreSQL works for this process on the same machine.

The sync writes batch n-1 while batch n encodes (sync/pipeline.py). The write-back's HNSW
insertions take a core of a local server for a few hundred milliseconds; torch's intra-op
threads, one per core, then wait for each other at every operation while one of them has no
core. One thread fewer for the encodes that overlap a write-back made 2,000-row syncs 1.10x
faster on 2 cores with bf16 (1.03x with fp32; BENCHMARKS.md, b/c). A server on another
machine takes no core here, so the pipeline only yields for a local one. onnxruntime's sessions
fix their threads when made, and one fewer measured no faster (1.02x): they keep theirs.

Process-wide, as torch's thread count is.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_working = 0  # write-backs in flight to a local server
_lowered_from: int | None = None  # torch's thread count while fit() holds it one lower


@contextmanager
def database_working() -> Iterator[None]:
    """While this runs, encodes on the CPU leave a core to the database (see `fit`)."""
    global _working
    with _lock:
        _working += 1
    try:
        yield
    finally:
        with _lock:
            _working -= 1


def fit() -> None:
    """Before an encode: one thread fewer while a local write-back runs, the count as it was
    otherwise (a count the application set itself is left alone).

    On the thread that encodes: OpenMP's thread count belongs to the thread that sets it. torch
    is imported here, not at the top: a cold query loads no torch."""
    import torch

    global _lowered_from
    if _working and _lowered_from is None:
        threads = torch.get_num_threads()
        if threads > 1:
            torch.set_num_threads(threads - 1)
            _lowered_from = threads
    elif not _working:
        restore()


def restore() -> None:
    """Give torch back the thread count fit() lowered, if it did (at the end of a drain)."""
    global _lowered_from
    if _lowered_from is not None:
        import torch

        torch.set_num_threads(_lowered_from)
        _lowered_from = None
