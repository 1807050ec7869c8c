"""Drain the queues with database I/O overlapped with encoding.

While batch n encodes on the calling thread, one I/O thread that owns the connection writes
batch n-1 and claims and reads batch n+1 (torch releases the GIL in its kernels, psycopg while it
waits on the network). Every batch keeps the guarantees of batch.py: short claim transactions
with a lease, md5-guarded writes, bisected failures. Every batch from its claim to the end of its
write-back (or release) is in `leases`, which the worker's LeaseRenewer renews (leases.py), so a
slow encode never lets a batch be claimed again; on stop a prefetched batch is released.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial
from typing import TypeVar

import psycopg

from pgembed import db
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import sharing
from pgembed.sync.batch import (
    BatchConfig,
    BatchResult,
    Claimed,
    ModelChanged,
    embed,
    fetch,
    release,
    write_back,
)
from pgembed.sync.isolate import Embedded
from pgembed.sync.leases import Leases
from pgembed.sync.vectorcache import VectorCache

log = logging.getLogger("pgembed.sync")

OnResult = Callable[[ModelSpec, BatchResult], None]
OnFailed = Callable[[ModelSpec, psycopg.Error], None]
Stored = tuple[ModelSpec, BatchResult] | None
_T = TypeVar("_T")


class Pipeline:
    """One drain: round-robin over the models until every queue is empty or stop is set."""

    def __init__(
        self,
        conn: psycopg.Connection,
        specs: Sequence[ModelSpec],
        config: BatchConfig,
        stop: threading.Event,
        on_result: OnResult,
        leases: Leases | None = None,
        on_failed: OnFailed | None = None,
        on_model_changed: Callable[[ModelSpec], None] = lambda _spec: None,
        interrupt: Callable[[], bool] = lambda: False,
        cache: VectorCache | None = None,
    ) -> None:
        self._conn = conn  # used only by the I/O thread while run() runs
        # A local server's write-backs take a core from the encode beside them (encode/sharing.py).
        self._local = db.is_local(conn)
        self._busy = list(specs)
        self._turn = 0
        self._config = config
        self._stop = stop
        self._on_result = on_result
        self._leases = leases if leases is not None else Leases()
        self._on_failed = on_failed or _log_failure  # on the I/O thread, which owns the connection
        self._on_model_changed = on_model_changed
        self._interrupt = interrupt  # checked once per batch: True ends the drain after it
        self._last_done = time.monotonic()
        # Held rows' vectors, for their next try (the worker's, so they outlive this drain).
        self._cache = cache if cache is not None else VectorCache()

    def run(self) -> bool:
        """Process batches until there are none or stop is set; True if any batch was done."""
        did_work = False
        with (
            ThreadPoolExecutor(1, thread_name_prefix="pgembed-io") as io,
            sharing.pipeline_encodes(),
        ):
            upcoming: Future[Claimed | None] | None = io.submit(self._fetch_next)
            writing: Future[Stored] | None = None
            try:
                while upcoming is not None:
                    claimed = upcoming.result()
                    upcoming = None
                    if claimed is None:
                        break
                    if self._stop.is_set():
                        io.submit(self._release, claimed).result()
                        break
                    if not self._interrupt():  # the next batch, claimed while this one encodes
                        upcoming = io.submit(self._fetch_next)
                    result = embed(claimed, self._config, self._cache)
                    self._collect(writing)
                    writing = io.submit(self._store, claimed, result)
                    did_work = True
                self._collect(writing)
            finally:
                self._abandon(io, upcoming)
                self._leases.clear()  # nothing outlives the drain: renewing it would strand it
        return did_work

    def _fetch_next(self) -> Claimed | None:
        """The next model's batch, round-robin; a model with nothing ready leaves the round."""
        while self._busy and not self._stop.is_set():
            spec = self._busy[self._turn % len(self._busy)]
            claimed = self._guarded(spec, partial(fetch, self._conn, spec, self._config))
            if claimed is None:
                self._drop(spec)
                continue
            self._turn += 1
            self._leases.add(spec.name, claimed.claims)
            return claimed
        return None

    def _store(self, claimed: Claimed, result: Embedded) -> Stored:
        now = time.monotonic()
        seconds, self._last_done = now - self._last_done, now  # wall time per batch, overlapped
        try:
            with sharing.database_working() if self._local else nullcontext():
                stored = self._guarded(
                    claimed.spec,
                    partial(
                        write_back, self._conn, claimed, result, self._config, seconds, self._leases
                    ),
                )
        finally:
            self._leases.drop(claimed.claims)
        if stored is None:
            return None
        self._cache.put(claimed.spec, result, stored.postponed_keys)
        return claimed.spec, stored

    def _release(self, claimed: Claimed) -> None:
        try:
            release(self._conn, claimed)
        finally:
            self._leases.drop(claimed.claims)

    def _guarded(self, spec: ModelSpec, step: Callable[[], _T]) -> _T | None:
        """Run a database step; an error that is not the connection's takes the model out.

        E.g. the model was removed while we worked: its claims expire and the other models go
        on. A broken connection is raised, for the worker to reconnect.
        """
        try:
            return step()
        except ModelChanged as exc:  # its batch was handed back; the worker rereads the catalog
            log.info("model=%s %s; rereading the catalog", spec.name, exc)
            if exc.done is not None:  # the slices written before the change
                self._on_result(spec, exc.done)
            self._drop(spec)
            self._on_model_changed(spec)
            return None
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            self._drop(spec)
            self._on_failed(spec, exc)
            return None

    def _drop(self, spec: ModelSpec) -> None:
        if spec in self._busy:
            self._busy.remove(spec)

    def _collect(self, writing: Future[Stored] | None) -> None:
        stored = writing.result() if writing is not None else None
        if stored is not None:
            self._on_result(*stored)

    def _abandon(self, io: ThreadPoolExecutor, upcoming: Future[Claimed | None] | None) -> None:
        """On the way out (stop or error): hand a prefetched batch back to the queue."""
        if upcoming is None:
            return
        try:
            claimed = upcoming.result()
            if claimed is not None:
                io.submit(self._release, claimed).result()
        except psycopg.Error:
            pass  # the connection is gone: the lease (or the reconnect's release) frees the keys


def _log_failure(spec: ModelSpec, exc: psycopg.Error) -> None:
    log.error("model=%s batch failed: %s", spec.name, db.first_line(exc))
