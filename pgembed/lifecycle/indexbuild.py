"""HNSW builds that never block searches: CREATE INDEX CONCURRENTLY, watched from a second session.

A concurrent build's lock (SHARE UPDATE EXCLUSIVE) never blocks reads or writes, so it needs no
lock_timeout; it does wait for older transactions to end, and the watcher says which it waits for.

Used by a reindex (the shadow column's index) and by `reindex --index-only` (a new index beside
the live one, swapped in by a rename in one short transaction).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import psycopg

from pgembed import db, defaults, sqlfiles
from pgembed.catalog import ddl, naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import UsageError
from pgembed.lifecycle import switch

log = logging.getLogger("pgembed.index")


@dataclass(frozen=True)
class BuildSettings:
    """Session settings for the build: HNSW builds fastest when the graph fits in memory."""

    maintenance_work_mem: str = defaults.MAINTENANCE_WORK_MEM
    parallel_workers: int = defaults.PARALLEL_MAINTENANCE_WORKERS
    poll_seconds: float = 0.5  # how often progress is read


@dataclass(frozen=True)
class BuildProgress:
    """One sample of pg_stat_progress_create_index: blocks while scanning, else tuples."""

    phase: str
    done: int
    total: int


OnBuildProgress = Callable[[BuildProgress], None]


def build(
    url: str,
    spec: ModelSpec,
    name: str,
    settings: BuildSettings,
    on_progress: OnBuildProgress | None = None,
    stop: threading.Event | None = None,
) -> bool:
    """Build index `name` on spec's column concurrently; False if `stop` cancelled it.

    A valid index of that name is kept (a resumed run has nothing to do); an invalid one, left
    by an interrupted CREATE INDEX CONCURRENTLY, is dropped and built again.
    """
    with db.connection(url) as conn:  # autocommit: CONCURRENTLY refuses a transaction block
        valid = ddl.index_valid(conn, spec.table_schema, name)
        if valid:
            return True
        if valid is False:
            log.info("dropping invalid index %s left by an interrupted build", name)
            ddl.drop_concurrently(conn, spec.table_schema, name)
        conn.execute(
            "SELECT pg_catalog.set_config('maintenance_work_mem', %s, false), "
            "pg_catalog.set_config('max_parallel_maintenance_workers', %s, false)",
            (settings.maintenance_work_mem, str(settings.parallel_workers)),
        )
        watcher = _Watcher(url, conn, on_progress, stop, settings.poll_seconds)
        watcher.start()
        try:
            ddl.create_index(conn, spec, concurrently=True, name=name)
        except psycopg.errors.QueryCanceled:
            if stop is not None and stop.is_set():
                return False
            raise
        finally:
            watcher.finish()
    return True


def rebuild(
    url: str,
    name: str,
    m: int | None,
    ef_construction: int | None,
    settings: BuildSettings,
    on_progress: OnBuildProgress | None = None,
    stop: threading.Event | None = None,
) -> ModelSpec | None:
    """`reindex --index-only`: a new index with the given parameters replaces the old one.

    Returns the model as recorded afterwards, or None when `stop` interrupted the build.
    """
    with db.connection(url) as conn:
        spec = registry.get(conn, name)
    if spec.shadow_of is not None:
        raise UsageError(f"{name!r} is a reindex shadow: rebuild the index of {spec.shadow_of!r}")
    wanted = replace(
        spec,
        hnsw_m=m if m is not None else spec.hnsw_m,
        hnsw_ef_construction=ef_construction
        if ef_construction is not None
        else spec.hnsw_ef_construction,
    )
    temporary = naming.rebuild_index_name(spec)
    with db.connection(url) as conn:
        if ddl.index_valid(conn, spec.table_schema, temporary) is not None:
            ddl.drop_concurrently(conn, spec.table_schema, temporary)  # a leftover of another run
    if not build(url, wanted, temporary, settings, on_progress, stop):
        return None
    with db.connection(url) as conn:
        return switch.swap_index(conn, wanted, temporary)


@contextmanager
def reporting_waits(
    url: str, builder: psycopg.Connection, on_wait: ddl.OnWait | None = None
) -> Iterator[None]:
    """While `builder` runs a concurrent index build, tell `on_wait` which sessions it waits for."""
    watcher = _Watcher(url, builder, None, None, on_wait=on_wait)
    watcher.start()
    try:
        yield
    finally:
        watcher.finish()


class _Watcher:
    """Polls the build's progress and what it waits for from a second session, and cancels the
    build on `stop`."""

    def __init__(
        self,
        url: str,
        builder: psycopg.Connection,
        on_progress: OnBuildProgress | None,
        stop: threading.Event | None,
        interval: float = 0.5,
        on_wait: ddl.OnWait | None = None,
    ) -> None:
        self._url = url
        self._builder = builder
        self._pid = builder.info.backend_pid
        self._on_progress = on_progress
        self._stop = stop
        self._interval = interval
        self._on_wait = on_wait or log.warning
        self._blockers: list[int] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pgembed-index-progress")

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        try:
            with db.connection(self._url) as conn:
                while not self._done.wait(self._interval):
                    if self._stop is not None and self._stop.is_set():
                        self._builder.cancel_safe()
                        return
                    self._report_waits(conn)
                    self._sample(conn)
        except psycopg.Error as exc:  # progress is a nicety: never fail the build over it
            log.warning("cannot read index build progress: %s", db.first_line(exc))

    def _report_waits(self, conn: psycopg.Connection) -> None:
        """One line each time the build starts waiting for other sessions' transactions."""
        row = conn.execute("SELECT pg_catalog.pg_blocking_pids(%s)", (self._pid,)).fetchone()
        blockers = sorted(row[0]) if row and row[0] else []
        if blockers and blockers != self._blockers:
            self._on_wait(
                f"the index build waits for pid {', '.join(map(str, blockers))} to end its "
                "transaction (reads and writes of the table go on meanwhile)"
            )
        self._blockers = blockers

    def _sample(self, conn: psycopg.Connection) -> None:
        row = conn.execute(
            sqlfiles.get("lifecycle", "index_build_progress"), {"pid": self._pid}
        ).fetchone()
        if row is None or self._on_progress is None:
            return
        phase, blocks_done, blocks_total, tuples_done, tuples_total = row
        if blocks_total:
            self._on_progress(BuildProgress(phase, blocks_done, blocks_total))
        else:
            self._on_progress(BuildProgress(phase, tuples_done or 0, tuples_total or 0))
