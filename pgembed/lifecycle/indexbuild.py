"""HNSW builds that never block searches: CREATE INDEX CONCURRENTLY, watched from a second session.

A concurrent build's lock (SHARE UPDATE EXCLUSIVE) never blocks reads or writes, so it needs no
lock_timeout; it does wait for older transactions to end, and the watcher says which it waits for.

Used by `model add` (over its new, nearly empty column), a reindex (the shadow column's index),
`model add --backfill` and `reindex --index-only` (a new index beside the live one, swapped in by
a rename in one short transaction). Unless the user names one, maintenance_work_mem is derived
from the graph's estimated size, and a graph too large for it is said before the build starts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import psycopg

from pgembed import checks, db, defaults, sqlfiles
from pgembed.catalog import ddl, naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import UsageError
from pgembed.lifecycle import switch

log = logging.getLogger("pgembed.index")


@dataclass(frozen=True)
class BuildSettings:
    """Session settings for the build: HNSW builds fastest when the graph fits in memory.

    maintenance_work_mem None: derived from the table's size (see `memory_for`)."""

    maintenance_work_mem: str | None = None
    parallel_workers: int = defaults.PARALLEL_MAINTENANCE_WORKERS
    poll_seconds: float = 0.5  # how often progress is read

    def __post_init__(self) -> None:
        if self.maintenance_work_mem is not None:
            checks.text("maintenance_work_mem", self.maintenance_work_mem)
        checks.integer(
            "parallel_workers", self.parallel_workers, 0, defaults.MAX_PARALLEL_MAINTENANCE_WORKERS
        )


def check(conn: psycopg.Connection, settings: BuildSettings) -> None:
    """The server takes this maintenance_work_mem: asked before a reindex registers anything, so
    a value it refuses is one line now, not a failed build after every row was embedded."""
    if settings.maintenance_work_mem is None:
        return
    try:
        with conn.transaction(force_rollback=True):
            conn.execute(
                "SELECT pg_catalog.set_config('maintenance_work_mem', %s, true)",
                (settings.maintenance_work_mem,),
            )
    except psycopg.DataError as exc:  # 22023 invalid_parameter_value
        raise UsageError(
            f"maintenance_work_mem {settings.maintenance_work_mem!r}: {exc.diag.message_primary}"
        ) from None


@dataclass(frozen=True)
class BuildProgress:
    """One sample of pg_stat_progress_create_index: blocks while scanning, else tuples."""

    phase: str
    done: int
    total: int


OnBuildProgress = Callable[[BuildProgress], None]
Say = Callable[[str], None]

_MB = 1024 * 1024


def graph_bytes(rows: int, dimensions: int, m: int) -> int:
    """What pgvector's in-memory HNSW graph of `rows` vectors takes, about: each element's vector
    (4 bytes a dimension), its layer-0 neighbour list (2m candidates of 16 bytes) and ~600 bytes
    of element, upper-layer and allocation overhead. 1M rows of 384 dimensions at m=16: 2.6 GB
    (issue 24 measured 2.7 GB)."""
    return rows * (dimensions * 4 + 2 * m * 16 + 600)


def estimated_rows(conn: psycopg.Connection, schema: str, table: str) -> int:
    """The planner's row count of the table (no scan); 0 for one never analysed."""
    query = sqlfiles.get("lifecycle", "estimated_rows")
    row = conn.execute(query, {"schema": schema, "name": table}).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def memory_for(
    conn: psycopg.Connection, spec: ModelSpec, settings: BuildSettings, *, filled: bool, say: Say
) -> str:
    """maintenance_work_mem for building spec's index: the user's, or the graph's estimated size
    (its column `filled`: every row of the table has a vector, else the column is new and
    nearly empty) between MAINTENANCE_WORK_MEM and the cap. `say` gets a hint when the graph will
    not fit: the build then goes on in pages on disk, several times slower."""
    rows = estimated_rows(conn, spec.table_schema, spec.table_name) if filled else 0
    needed = graph_bytes(rows, spec.dimensions, spec.hnsw_m)
    needed_mb = -(-needed // _MB)
    if settings.maintenance_work_mem is not None:
        chosen = settings.maintenance_work_mem
        row = conn.execute("SELECT pg_catalog.pg_size_bytes(%s)", (chosen,)).fetchone()
        have = int(row[0]) if row else 0
    else:
        floor_row = conn.execute(
            "SELECT pg_catalog.pg_size_bytes(%s)", (defaults.MAINTENANCE_WORK_MEM,)
        ).fetchone()
        floor_mb = int(floor_row[0]) // _MB if floor_row else 1024
        chosen_mb = min(max(needed_mb, floor_mb), defaults.MAINTENANCE_WORK_MEM_CAP_MB)
        chosen, have = f"{chosen_mb}MB", chosen_mb * _MB
    if needed > have:
        say(
            f"the HNSW graph of about {rows} rows x {spec.dimensions} dimensions needs about "
            f"{needed_mb} MB; maintenance_work_mem {chosen} is smaller, so the build will spill "
            f"to disk and be several times slower: give it --maintenance-work-mem {needed_mb}MB "
            "if the server has the memory"
        )
    return chosen


def build(
    url: str,
    spec: ModelSpec,
    name: str,
    settings: BuildSettings,
    on_progress: OnBuildProgress | None = None,
    stop: threading.Event | None = None,
    *,
    on_wait: ddl.OnWait | None = None,
    on_note: Say | None = None,
    filled: bool = True,
) -> bool:
    """Build index `name` on spec's column concurrently; False if `stop` cancelled it.

    A valid index of that name is kept (a resumed run has nothing to do); an invalid one, left
    by an interrupted CREATE INDEX CONCURRENTLY, is dropped and built again. A second session
    tells `on_progress` how far the build is and `on_wait` whose transactions it waits for.
    """
    say = on_note or log.warning
    with db.connection(url) as conn:  # autocommit: CONCURRENTLY refuses a transaction block
        if not _prepare(conn, spec, name, settings, filled, say):
            return True
        _relay_memory_notices(conn, say)
        watcher = _Watcher(url, conn, on_progress, stop, settings.poll_seconds, on_wait)
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


def build_here(
    conn: psycopg.Connection, spec: ModelSpec, name: str, settings: BuildSettings
) -> None:
    """`build` on the caller's autocommit connection, unwatched (no URL for a second session)."""
    if _prepare(conn, spec, name, settings, False, log.warning):
        ddl.create_index(conn, spec, concurrently=True, name=name)


def _prepare(
    conn: psycopg.Connection,
    spec: ModelSpec,
    name: str,
    settings: BuildSettings,
    filled: bool,
    say: Say,
) -> bool:
    """Whether index `name` is still to be built; drops an invalid one and sets the session's
    memory and parallel workers for the build (a hint to `say` if the graph will not fit)."""
    valid = ddl.index_valid(conn, spec.table_schema, name)
    if valid:
        return False
    if valid is False:
        log.info("dropping invalid index %s left by an interrupted build", name)
        ddl.drop_concurrently(conn, spec.table_schema, name)
    if filled:
        memory: str | None = memory_for(conn, spec, settings, filled=True, say=say)
        workers = settings.parallel_workers
    else:
        # A new, empty column: nothing to hold in memory, and parallel workers would each get a
        # shared-memory segment sized by maintenance_work_mem for nothing (a container's 64 MB
        # /dev/shm fails them). The server's own memory setting, or the user's, and no workers.
        memory, workers = settings.maintenance_work_mem, 0
    if memory is not None:
        conn.execute("SELECT pg_catalog.set_config('maintenance_work_mem', %s, false)", (memory,))
    conn.execute(
        "SELECT pg_catalog.set_config('max_parallel_maintenance_workers', %s, false)",
        (str(workers),),
    )
    return True


def _relay_memory_notices(conn: psycopg.Connection, say: Say) -> None:
    """pgvector says when the graph outgrows maintenance_work_mem ("hnsw graph no longer fits
    into maintenance_work_mem after N tuples"): pass that on."""

    def relay(notice: psycopg.errors.Diagnostic) -> None:
        text = notice.message_primary or ""
        if "maintenance_work_mem" in text:
            say(f"index build: {text}")

    conn.add_notice_handler(relay)


def rebuild(
    url: str,
    name: str,
    m: int | None,
    ef_construction: int | None,
    settings: BuildSettings,
    on_progress: OnBuildProgress | None = None,
    stop: threading.Event | None = None,
    on_note: Say | None = None,
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
    if not build(
        url, wanted, temporary, settings, on_progress, stop, on_wait=on_note, on_note=on_note
    ):
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


def waiting_line(rows: list[tuple[Any, ...]]) -> str:
    """What a concurrent build waits for, from blocking_sessions' rows (pid, state, seconds in
    the transaction, database): a line that names each session and how long it has been open."""
    sessions = []
    for pid, state, seconds, database in rows:
        if state is None:  # another role's session: pg_stat_activity hides its details
            sessions.append(f"the transaction of pid {pid}")
            continue
        age = f" for {seconds:.0f} s" if seconds is not None else ""
        where = f", database {database}" if database else ""
        sessions.append(f"the transaction of pid {pid} ({state}{age}{where})")
    return (
        f"the index build waits for {' and '.join(sessions)} to finish: a concurrent build "
        "waits for every older transaction (reads and writes of the table go on meanwhile)"
    )


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
        rows = conn.execute(
            sqlfiles.get("lifecycle", "blocking_sessions"), {"pid": self._pid}
        ).fetchall()
        blockers = [int(row[0]) for row in rows]
        if blockers and blockers != self._blockers:
            self._on_wait(waiting_line(rows))
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
