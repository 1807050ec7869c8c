"""A live worker keeps what it claimed: a thread with its own connection pushes the lease of every
batch the worker holds (in hand, prefetched, being written) forward every lease/3, and sends the
worker's heartbeat, however long an encode takes. A dead worker renews nothing: its keys come
back when their last lease runs out.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg

from pgembed import db
from pgembed.errors import DatabaseError
from pgembed.sync import store
from pgembed.sync.store import Claim

log = logging.getLogger("pgembed.sync")


class Leases:
    """The batches a worker holds leased; the pipeline adds and drops them, the renewer reads
    them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: list[tuple[str, Sequence[Claim]]] = []
        # Taken by the renewer while its renewal runs. store.postpone skips a queue entry it finds
        # locked (the application's transaction may hold it): one a renewal had locked at that
        # moment would wait out its lease (a minute) instead of its pause.
        self._renewing = threading.Lock()

    def add(self, model: str, claims: Sequence[Claim]) -> None:
        with self._lock:
            self._batches.append((model, claims))

    def drop(self, claims: Sequence[Claim]) -> None:
        """Forget one batch (by identity: the same key may be in two batches of a slow worker)."""
        with self._lock:
            self._batches = [(m, c) for m, c in self._batches if c is not claims]

    def clear(self) -> None:
        with self._lock:
            self._batches = []

    def pairs(self) -> list[tuple[str, Claim]]:
        with self._lock:
            return [(model, claim) for model, claims in self._batches for claim in claims]

    @contextmanager
    def renewing(self) -> Iterator[None]:
        with self._renewing:
            yield

    @contextmanager
    def no_renewal(self, timeout: float = 2.0) -> Iterator[None]:
        """No renewal runs inside: wait for one in flight (a single short statement that waits
        for no row lock), at most `timeout` seconds, then go on regardless."""
        got = self._renewing.acquire(timeout=timeout)
        try:
            yield
        finally:
            if got:
                self._renewing.release()


class LeaseRenewer:
    """Renews the leases and sends heartbeats from its own thread and connection."""

    def __init__(
        self, url: str, worker_id: str, lease_seconds: float, heartbeat_seconds: float
    ) -> None:
        self.leases = Leases()
        self._url = url
        self._worker_id = worker_id
        self._lease = lease_seconds
        self._heartbeat = heartbeat_seconds
        self._interval = min(lease_seconds / 3, heartbeat_seconds)
        self._models: list[str] = []
        self._conn: psycopg.Connection | None = None
        self._last_beat = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, models: Sequence[str]) -> None:
        """Say the worker is alive now (a fault here is the caller's), then keep at it."""
        self._models = list(models)
        self._conn = self._connect()
        self._beat(self._conn)
        self._thread = threading.Thread(target=self._run, name="pgembed-leases", daemon=True)
        self._thread.start()

    def serve(self, models: Sequence[str]) -> None:
        """The models the next heartbeat names."""
        self._models = list(models)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._tick()
            except (psycopg.Error, DatabaseError) as exc:
                # The worker's own connection sees the same fault and reconnects the session;
                # a fault of this connection alone is healed at the next tick.
                log.warning("lease renewer: %s; trying again", db.first_line(exc))
                if self._conn is not None:
                    self._conn.close()

    def _tick(self) -> None:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        with self.leases.renewing():
            pairs = self.leases.pairs()
            if pairs:
                store.renew(self._conn, self._worker_id, pairs, self._lease)
        if time.monotonic() - self._last_beat >= self._heartbeat:
            self._beat(self._conn)

    def _connect(self) -> psycopg.Connection:
        conn = db.connect(self._url, vector=False)
        store.name_renewer(conn, self._worker_id)  # this session's life is the worker's
        return conn

    def _beat(self, conn: psycopg.Connection) -> None:
        self._last_beat = time.monotonic()
        store.heartbeat(conn, self._worker_id, socket.gethostname(), os.getpid(), self._models)
