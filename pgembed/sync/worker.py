"""The sync loop: drain the queues, wait for a NOTIFY (or the poll timer, or stop), repeat.

A NOTIFY only wakes the loop; the SKIP LOCKED claim is the source of truth, so a lost
notification costs latency, never data. Once the worker has reached its database, a dropped
connection or a restarted server at any moment (model load included) is logged and reconnected
with backoff; only faults that will not heal (authentication, schema) end the worker. A model
whose table or column is gone is skipped, said once, and served again when it is back. A model
is loaded when it first has keys ready, before they are claimed: a `sync --once` with nothing
queued loads none.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import psycopg

from pgembed import db, defaults, migrate
from pgembed.catalog import registry, trust
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.errors import ConfigError, DatabaseError, NotFoundError
from pgembed.sync import batch, store
from pgembed.sync.batch import BatchConfig, BatchResult
from pgembed.sync.leases import LeaseRenewer
from pgembed.sync.pipeline import Pipeline
from pgembed.sync.vectorcache import VectorCache

if TYPE_CHECKING:  # prometheus_client is imported by `sync --metrics-port` only
    from pgembed.sync.metrics import Health

log = logging.getLogger("pgembed.sync")

OnBatch = Callable[[str, int], None]  # (model, keys claimed) after each batch, for progress bars

# Faults that retrying will not fix: refused authentication, a database that does not exist.
_PERMANENT_SQLSTATES = {"28000", "28P01", "3D000"}
_PERMANENT_MESSAGES = ("authentication failed", "no pg_hba.conf entry", "does not exist")


def permanent(exc: Exception) -> bool:
    """Whether a database fault will not heal by waiting (authentication, no such database)."""
    if getattr(exc, "sqlstate", None) in _PERMANENT_SQLSTATES:
        return True
    return any(fragment in str(exc) for fragment in _PERMANENT_MESSAGES)


@dataclass(frozen=True)
class Options:
    models: tuple[str, ...] = ()  # empty: every model in the catalog
    claim_size: int = defaults.CPU_CLAIM_SIZE  # keys claimed at once
    lease_seconds: float = defaults.LEASE_SECONDS
    poll_seconds: float = defaults.POLL_SECONDS
    max_attempts: int = defaults.MAX_ATTEMPTS
    once: bool = False
    heartbeat_seconds: float = defaults.HEARTBEAT_SECONDS
    max_backoff_seconds: float = defaults.MAX_BACKOFF_SECONDS
    device: str = "cpu"  # a resolved device: cpu, cuda or mps


@dataclass
class Stats:
    written: int = 0
    skipped: int = 0
    failed: int = 0


class Backoff:
    """Waits between reconnect attempts: doubling from `first` up to `cap`, and from `first`
    again once a session is up (a restart next week does not start at the cap)."""

    def __init__(self, cap: float, first: float = 0.5) -> None:
        self.cap = cap
        self.first = first
        self._delay = 0.0

    def next(self) -> float:
        self._delay = min(self.cap, max(self.first, self._delay * 2))
        return self._delay

    def reset(self) -> bool:
        """Start over; True if there was a fault to recover from."""
        faulted, self._delay = self._delay > 0, 0.0
        return faulted


class Worker:
    def __init__(
        self,
        url: str,
        options: Options,
        on_progress: OnBatch | None = None,
        *,
        reached: bool = False,
        revive: Callable[[], None] | None = None,
        health: Health | None = None,
    ) -> None:
        """`reached`: the caller has already connected to `url`, so even a fault on the first
        connection is one to ride out (a restart), not a wrong URL to report. `revive`: called
        after each fault to start the server again if it is down (the embedded server's).
        `health`: told of sessions, faults and batches (`sync --metrics-port`)."""
        self.url = url
        self.options = options
        self.id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stop_event = threading.Event()
        self.stats = Stats()
        self.backoff = Backoff(options.max_backoff_seconds)
        self._on_progress = on_progress
        self.health = health
        self._revive = revive
        self._reached = reached  # the database has answered once: faults from now on heal
        self._started = False  # set once the first session is up and serving
        self._stale = False  # a model changed under a batch: reread the catalog
        self._broken: dict[str, str] = {}  # model -> why its table cannot be served (logged once)
        self._config = BatchConfig(
            self.id, options.claim_size, options.lease_seconds, options.max_attempts, options.device
        )
        self._cache = VectorCache()  # held rows' vectors, across drains
        self._loaded: set[embedder.Settings] = set()  # the models this worker has loaded

    def stop(self) -> None:
        self.stop_event.set()

    @property
    def broken(self) -> dict[str, str]:
        """Models skipped because their table or a column is gone, with the reason."""
        return dict(self._broken)

    def run(self) -> Stats:
        """Work until stopped (or, with `once`, until the queues are empty).

        A fault before the database was ever reached is reported at once (a wrong URL should
        not hang); afterwards the worker rides out restarts and dropped connections with
        backoff, whenever they come: during its startup and model load too.
        """
        while not self.stop_event.is_set():
            try:
                self._session()
                return self.stats
            except (psycopg.OperationalError, DatabaseError) as exc:
                if not self._reached or permanent(exc):
                    if isinstance(exc, DatabaseError):
                        raise
                    raise DatabaseError(f"database error: {db.first_line(exc)}") from None
                delay = self.backoff.next()
                log.warning("database fault (%s); reconnecting in %.1fs", db.first_line(exc), delay)
                if self.health is not None:
                    self.health.fault(db.first_line(exc))
                self._revive_server()
                self.stop_event.wait(delay)
        return self.stats

    def _revive_server(self) -> None:
        if self._revive is None:
            return
        try:
            self._revive()
        except ConfigError as exc:  # said each time: the next fault tries again
            log.warning("%s", exc)

    def _session(self) -> None:
        """One connected stretch of work; returns when done, raises when the connection fails."""
        conn = db.connect(self.url)
        # Never a prepared statement: a table owner's code, run in this session as that owner
        # (store.write_as_owner), could put its own statement under the name of one.
        conn.prepare_threshold = None
        self._reached = True
        renewer = LeaseRenewer(
            self.url, self.id, self.options.lease_seconds, self.options.heartbeat_seconds
        )
        listener: psycopg.Connection | None = None
        try:
            listener = db.connect(self.url, vector=False)
            migrate.require_current(conn)
            store.require_primary(conn)
            store.listen(listener)
            if self._started:  # claims leased before the fault are dead: hand them back now
                store.release_worker(conn, self.id)
            if self.backoff.reset():
                log.info("reconnected to the database")
            try:
                self._loop(conn, listener, renewer)
            except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
                migrate.require_current(conn)  # says "run `pgembed migrate`" if that is the cause
                raise
            renewer.close()  # before leaving the list of workers, so no heartbeat comes after
            store.worker_exit(conn, self.id)
        finally:
            renewer.close()
            conn.close()
            if listener is not None:
                listener.close()

    def _loop(
        self, conn: psycopg.Connection, listener: psycopg.Connection, renewer: LeaseRenewer
    ) -> None:
        specs = self.models(conn, strict=not self._started)
        self.load_ready(conn, specs)  # before the first heartbeat, as ever
        renewer.start(_names(specs))
        self._started = True
        if self.health is not None:
            self.health.serving()
        while not self.stop_event.is_set():
            announced = partial(self._new_model_announced, listener, specs)
            did_work = self.drain(conn, specs, announced, renewer)
            if self._stale:  # a model was altered or reindexed under a batch: reread the catalog
                self._stale = False
                specs = self._reread(conn, renewer)
                continue
            if self.options.once and not did_work:
                return
            if not did_work:
                self._wait(listener)
                specs = self._reread(conn, renewer)  # models added, removed, broken or mended

    def _reread(self, conn: psycopg.Connection, renewer: LeaseRenewer) -> list[ModelSpec]:
        specs = self.models(conn)
        self.load_ready(conn, specs)
        renewer.serve(_names(specs))
        return specs

    def models(self, conn: psycopg.Connection, strict: bool = False) -> list[ModelSpec]:
        """The models to serve; a model whose table cannot be served is left out (see
        `_servable`). None is loaded here: see `load_ready`."""
        if not self.options.models:
            specs = registry.all_models(conn)
        else:
            specs = []
            for name in self.options.models:
                try:
                    specs.append(registry.get(conn, name))
                except NotFoundError:
                    if strict:
                        raise
                    log.warning("model %s no longer exists; skipping it", name)
        return [spec for spec in specs if self._servable(conn, spec)]

    def load_ready(self, conn: psycopg.Connection, specs: Sequence[ModelSpec]) -> None:
        """Load the model of each spec that has keys ready and is not loaded yet: before its
        keys are claimed, so a load (seconds) delays no lease, and only when there is work, so
        a `sync --once` with nothing queued loads no model. One EXISTS per model not loaded
        yet; a model whose keys come in after this check is loaded by its first batch
        (batch.embed), its lease renewed meanwhile (leases.py)."""
        for spec in specs:
            wanted = settings_of(spec, self.options.device)
            if wanted in self._loaded or not store.has_ready(conn, spec.name):
                continue
            log.debug("model=%s loading %s", spec.name, wanted.model_ref)
            batch.load(spec, self.options.device)
            self._loaded.add(wanted)

    def _servable(self, conn: psycopg.Connection, spec: ModelSpec) -> bool:
        """Whether the model's table and columns are there and this role may sync it safely and
        whole (catalog/trust.py); a new reason is logged once, and the model is checked again
        at each catalog read (after a wait, or a change)."""
        reason = trust.broken(conn, spec)
        before = self._broken.pop(spec.name, None)
        if reason is None:
            if before is not None:
                log.info("model=%s: its table is whole again; serving it", spec.name)
            return True
        if reason != before:
            log.error("model=%s skipped: %s", spec.name, reason)
        self._broken[spec.name] = reason
        return False

    def drain(
        self,
        conn: psycopg.Connection,
        specs: Sequence[ModelSpec],
        interrupt: Callable[[], bool] = lambda: False,
        renewer: LeaseRenewer | None = None,
    ) -> bool:
        """Batches of each model in turn, until every queue is empty, stop is asked or
        `interrupt` says so; database I/O overlaps encoding (see pipeline.py)."""
        pipeline = Pipeline(
            conn,
            specs,
            self._config,
            self.stop_event,
            on_result=self._count,
            leases=renewer.leases if renewer is not None else None,
            on_failed=partial(self._batch_failed, conn),
            on_model_changed=self._model_changed,
            interrupt=interrupt,
            cache=self._cache,
        )
        return pipeline.run()

    def _batch_failed(self, conn: psycopg.Connection, spec: ModelSpec, exc: psycopg.Error) -> None:
        """On the I/O thread: a batch's SQL failed. A table or column gone is said once (and the
        catalog reread without the model); any other error is logged as it comes."""
        if self._servable(conn, spec):
            log.error("model=%s batch failed: %s", spec.name, db.first_line(exc))
        else:
            self._stale = True

    def _new_model_announced(
        self, listener: psycopg.Connection, specs: Sequence[ModelSpec]
    ) -> bool:
        """Whether a NOTIFY names a model this worker does not serve yet (added, or a reindex
        shadow): then the drain pauses after its batch and the catalog is reread, so a long
        backlog of one model does not keep a new one waiting."""
        if self.options.models:
            return False  # serves only the models it was given
        known = {spec.name for spec in specs} | set(self._broken)
        for note in listener.notifies(timeout=0):
            if note.payload and note.payload not in known:
                self._stale = True
        return self._stale

    def _model_changed(self, spec: ModelSpec) -> None:
        """A model was altered or reindexed under a batch: reread the catalog before going on."""
        self._stale = True

    def _count(self, spec: ModelSpec, result: BatchResult) -> None:
        self.stats.written += result.written
        self.stats.skipped += result.skipped
        self.stats.failed += result.failed
        if self.health is not None:
            self.health.batch(
                spec.name, result.written, result.skipped, result.failed, result.seconds
            )
        if self._on_progress:
            self._on_progress(spec.name, result.claimed)

    def _wait(self, listener: psycopg.Connection) -> None:
        """Sleep until a NOTIFY, the poll timer or stop; in short slices so stop is prompt."""
        deadline = time.monotonic() + self.options.poll_seconds
        while not self.stop_event.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for _ in listener.notifies(timeout=min(remaining, 0.5), stop_after=1):
                return


def _names(specs: Sequence[ModelSpec]) -> list[str]:
    return [spec.name for spec in specs]
