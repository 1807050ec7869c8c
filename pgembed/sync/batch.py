"""One batch of one model in three steps: fetch (claim + read), embed, write_back (write +
account). fetch and write_back are short database work (their SQL is in store.py); embed runs
outside any transaction. pipeline.py overlaps the steps across consecutive batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg

from pgembed import db
from pgembed.catalog import registry, trust
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder, hardware
from pgembed.encode.settings import runtime_settings
from pgembed.sync import store
from pgembed.sync.isolate import Embedded, embed_rows
from pgembed.sync.leases import Leases
from pgembed.sync.store import Claim, SourceRow
from pgembed.sync.vectorcache import VectorCache

log = logging.getLogger("pgembed.sync")

# A row an application's transaction holds is tried again later, not waited for (a wait can
# deadlock with that transaction): after half the time its key has been queued, at least this
# (a retry sooner would embed it again while it is held) and at most BUSY_ROW_MAX_PAUSE_SECONDS
# (a row held by a long transaction is embedded again some 10 times in its first minute, then
# once a minute, rather than at every pass).
BUSY_ROW_PAUSE_SECONDS = 1.0
BUSY_ROW_MAX_PAUSE_SECONDS = 60.0
# Any other lock the write-back waits for longer than this gives its batch back: below
# PostgreSQL's default deadlock_timeout (1 s), so in a deadlock with an application's
# transaction that began waiting after the daemon, the daemon gives up first and the
# application's transaction goes on.
WRITE_LOCK_TIMEOUT = "500ms"
# A write-back holds its rows' locks until its commit, while pgvector inserts each vector into
# the graph (8.5 ms a row at a million rows, BENCHMARKS.md): an application's UPDATE of one of
# those rows waits that long. So a batch is written in slices of about WRITE_SLICE_SECONDS, each
# its own transaction: the first of FIRST_SLICE_ROWS rows, the next sized by the last one's time.
WRITE_SLICE_SECONDS = 0.2
FIRST_SLICE_ROWS = 32
MIN_SLICE_ROWS = 8


# SQLSTATE classes of a write's error that say nothing of its rows: the server or the session
# (a broken connection, a lock or deadlock, a cancel, a shutdown, no resources, an internal
# error). Any other error of the statement that writes the user's table is taken for a refusal
# by the table's own code (its triggers, rules, constraints, policies; or pgembed's writer as
# its owner): Refused.
_NOT_REFUSALS = ("08", "25", "40", "53", "55", "57", "58", "F0", "XX")


class Refused(Exception):
    """The write of a slice's vectors failed, most likely for its rows (see _NOT_REFUSALS): the
    slice is bisected until the refused rows are alone, and each of those fails an attempt."""

    def __init__(self, error: psycopg.Error) -> None:
        super().__init__(db.first_line(error))
        self.error = error


class ModelChanged(Exception):
    """The model was altered, reindexed or removed after the worker read the catalog.

    `done`: what the write-back's slices before the change did (their rows are written)."""

    def __init__(self, message: str, done: BatchResult | None = None) -> None:
        super().__init__(message)
        self.done = done


@dataclass(frozen=True)
class BatchResult:
    claimed: int
    written: int
    failed: int
    postponed: int = 0  # rows another transaction held: tried again later (store.postpone)
    postponed_keys: frozenset[str] = frozenset()  # their keys (pipeline.py keeps their vectors)
    seconds: float = 0.0  # the worker's time for it, batches overlapping (0: not timed)

    @property
    def skipped(self) -> int:
        """Keys whose row was gone, blank, or changed while it was being embedded."""
        return self.claimed - self.written - self.failed - self.postponed


@dataclass(frozen=True)
class BatchConfig:
    worker_id: str
    claim_size: int  # keys claimed at once (encode batches are the embedder's own)
    lease_seconds: float
    max_attempts: int
    device: str = "cpu"


@dataclass(frozen=True)
class Claimed:
    """Claimed keys and the rows they still have (gone or blank rows do not come back)."""

    spec: ModelSpec
    claims: list[Claim]
    rows: list[SourceRow]
    unreadable: int = 0  # claimed keys whose read failed: their attempt is recorded (_read)


def fetch(conn: psycopg.Connection, spec: ModelSpec, config: BatchConfig) -> Claimed | None:
    """Claim up to a batch of ready keys and read their text; None when nothing is ready.

    Captured inserts are moved to the queue first, every time: an insert still in the inbox
    when its key's queue entry (an UPDATE after the INSERT) is claimed and completed would
    come back as new work, and the row be embedded twice."""
    store.transfer(conn, spec.name)
    claims = store.claim(conn, spec.name, config.worker_id, config.claim_size, config.lease_seconds)
    if not claims:
        return None
    read, rows = _read(conn, spec, claims, config)
    return Claimed(spec, read, rows, unreadable=len(claims) - len(read))


def _read(
    conn: psycopg.Connection, spec: ModelSpec, claims: list[Claim], config: BatchConfig
) -> tuple[list[Claim], list[SourceRow]]:
    """store.read, bisected when one key's read fails with a data error (a key the key column's
    type cannot read: queued by hand, or from before the column's type changed): that key alone
    fails an attempt, with why, instead of failing its whole batch each time it is claimed."""
    try:
        return claims, store.read(conn, spec, [c.key for c in claims])
    except psycopg.DataError as exc:  # SQLSTATE class 22: invalid text, out of range
        if len(claims) > 1:
            middle = len(claims) // 2
            first, first_rows = _read(conn, spec, claims[:middle], config)
            rest, rest_rows = _read(conn, spec, claims[middle:], config)
            return first + rest, first_rows + rest_rows
        error = f"reading key {claims[0].key!r} failed: {db.first_line(exc)}"
        moved = store.fail(conn, spec.name, claims[0], error, config.max_attempts)
        log.warning(
            "model=%s %s%s", spec.name, error, " (moved to failures)" if moved else ", will retry"
        )
        return [], []


def embed(claimed: Claimed, config: BatchConfig, cache: VectorCache | None = None) -> Embedded:
    """The batch's vectors: those `cache` has for a row's text as read now, the rest embedded."""
    found, rest = (Embedded(), claimed.rows)
    if cache is not None:
        found, rest = cache.take(claimed.spec, claimed.rows)
    if not rest:  # every row's vector was cached: the model need not even be loaded
        return found
    return embed_rows(load(claimed.spec, config.device), rest, claimed.spec.windows).joined(found)


def load(spec: ModelSpec, device: str) -> embedder.Embedder:
    """The model's encoder, loaded once per process (embedder.get); torch's threads set for
    this process's CPUs before the first load (hardware.use_all_cores)."""
    hardware.use_all_cores()
    return embedder.get(runtime_settings(spec, device))


def write_back(
    conn: psycopg.Connection,
    claimed: Claimed,
    result: Embedded,
    config: BatchConfig,
    seconds: float,
    leases: Leases | None = None,
) -> BatchResult:
    """Write the vectors whose text is unchanged, complete the claims, record failures.

    The daemon never waits long for an application's transaction: rows another transaction holds
    are skipped and their keys tried again later (store.lock), and any other lock wait longer than
    WRITE_LOCK_TIMEOUT gives the whole batch back (BatchResult.postponed).

    A table whose owner is another role (not a superuser) is written as that owner
    (catalog/trust.py): its rows are locked first, the daemon's own work comes next, and the
    owner's write last, so nothing of the daemon's runs in the session after the owner's code
    until clean_session has put it right.

    `leases` holds the worker's leased batches: no renewal of their leases runs beside a
    postpone (Leases.no_renewal).

    The rows are written in slices, each its own transaction (WRITE_SLICE_SECONDS): a lock wait
    gives back the slice it stopped and the ones after it; the slices before stay written.

    A slice whose write the table's own code refuses (a trigger that raises, a constraint, or
    pgembed's writer as the owner: Refused) is bisected until each refused row is alone; that
    row fails an attempt like a row the model fails on (its error kept, to pgembed.failures
    after max_attempts), and the rows beside it are written."""
    leases = leases if leases is not None else Leases()
    done = _Progress()
    rows = Rows.of(result)
    try:
        return _write_back(conn, claimed, rows, config, seconds, leases, done)
    except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
        # The rows no committed slice settled are tried again later, but for those the model
        # failed on: their attempt counts (else a batch that keeps meeting a lock would retry them
        # past --max-attempts).
        left = [c for c in claimed.claims if c.key not in done.settled and c.key not in rows.failed]
        with conn.transaction():
            postponed = _postpone(conn, claimed.spec.name, left, leases)
        _record_failures(conn, claimed.spec, config, {c.key: c for c in claimed.claims}, result)
        log.warning(
            "model=%s %d of a batch's %d rows given back, to try again in %.0f-%.0f s: %s",
            claimed.spec.name,
            len(left),
            len(claimed.claims),
            BUSY_ROW_PAUSE_SECONDS,
            BUSY_ROW_MAX_PAUSE_SECONDS,
            db.first_line(exc),
        )
        return _result(
            claimed,
            len(claimed.claims),
            done.written,
            len(rows.failed) + done.refused,
            postponed=done.postponed + postponed,
            postponed_keys=frozenset(done.postponed_keys | {c.key for c in left}),
        )


@dataclass
class _Progress:
    """What the committed slices of a write-back did."""

    written: int = 0
    postponed: int = 0
    held: int = 0
    refused: int = 0  # keys whose write the table's own code refused (Refused): attempts failed
    settled: set[str] = field(default_factory=set)  # keys completed, postponed or refused
    postponed_keys: set[str] = field(default_factory=set)

    def add(self, slice_: _Written) -> None:
        self.written += slice_.written
        self.postponed += slice_.postponed
        self.held += len(slice_.plan.busy)
        self.settled |= slice_.plan.settled
        self.postponed_keys.update(c.key for c in slice_.plan.busy)


def _write_back(
    conn: psycopg.Connection,
    claimed: Claimed,
    rows: Rows,
    config: BatchConfig,
    seconds: float,
    leases: Leases,
    done: _Progress,
) -> BatchResult:
    spec, claims, result = claimed.spec, claimed.claims, rows.result
    # In key order, the order each slice locks its rows in.
    pending = sorted(claims, key=lambda c: c.key)
    size = FIRST_SLICE_ROWS
    while pending:
        part, pending = pending[:size], pending[size:]
        started = time.monotonic()
        _write_part(
            conn, claimed, part, rows, config, seconds * len(part) / len(claims), leases, done
        )
        per_row = (time.monotonic() - started) / len(part)
        size = max(MIN_SLICE_ROWS, int(WRITE_SLICE_SECONDS / max(per_row, 1e-6)))
    _record_failures(conn, spec, config, {c.key: c for c in claims}, result)
    figures = _result(
        claimed,
        len(claims),
        done.written,
        len(result.failed) + done.refused,
        postponed=done.postponed,
        postponed_keys=frozenset(done.postponed_keys),
        seconds=seconds,
    )
    log.info(
        "model=%s rows=%d written=%d failed=%d held=%d reused=%d seconds=%.2f rows_per_second=%.1f",
        spec.name,
        figures.claimed,
        done.written,
        figures.failed,
        done.held,
        result.reused,
        seconds,
        figures.claimed / max(seconds, 1e-9),
    )
    return figures


def _result(
    claimed: Claimed,
    settled: int,
    written: int,
    failed: int,
    postponed: int = 0,
    postponed_keys: frozenset[str] = frozenset(),
    seconds: float = 0.0,
) -> BatchResult:
    """A batch's figures, the keys _read could not read counted as claimed and failed (their
    attempt is recorded there)."""
    unreadable = claimed.unreadable
    return BatchResult(
        settled + unreadable, written, failed + unreadable, postponed, postponed_keys, seconds
    )


@dataclass(frozen=True)
class Rows:
    """A batch's embedded rows, looked up by key, for each slice."""

    result: Embedded
    matrix: embedder.Vectors
    position: dict[str, int]  # key -> its row in result.rows and in matrix
    failed: set[str]

    @classmethod
    def of(cls, result: Embedded) -> Rows:
        position = {row.key: i for i, row in enumerate(result.rows)}
        return cls(result, result.matrix(), position, {row.key for row, _ in result.failed})


@dataclass(frozen=True)
class SlicePlan:
    """What one slice's transaction writes, completes and postpones, once its rows are locked."""

    keys: list[str]  # the rows to write: locked, their text unchanged; in key order
    md5s: list[str]  # their texts' md5, which the write checks again
    positions: list[int]  # their vectors' rows in the batch's matrix
    complete: list[Claim]  # done: written, or their row gone, blank or changed (not failed)
    busy: list[Claim]  # their row another transaction holds: postponed

    @property
    def settled(self) -> set[str]:
        """The keys this slice completes or postpones."""
        return {c.key for c in [*self.complete, *self.busy]}


def to_lock(part: list[Claim], rows: Rows) -> tuple[list[str], list[str]]:
    """The keys of `part` that have an embedded row (a failed or unread row has none), with
    their texts' md5 as read: what store.lock locks and checks."""
    embedded = [rows.result.rows[rows.position[c.key]] for c in part if c.key in rows.position]
    return [row.key for row in embedded], [row.text_md5 for row in embedded]


def plan_slice(
    part: list[Claim], rows: Rows, locking: tuple[list[str], list[str]], locked: store.Locked
) -> SlicePlan:
    """The slice's plan from what store.lock found for the keys and md5s `locking` (to_lock's):
    no database, so a test needs none."""
    keys, md5s = locking
    write = [i for i, key in enumerate(keys) if locked.same.get(key)]
    return SlicePlan(
        [keys[i] for i in write],
        [md5s[i] for i in write],
        [rows.position[keys[i]] for i in write],
        [c for c in part if c.key not in rows.failed and c.key not in locked.held],
        [c for c in part if c.key in locked.held],
    )


@dataclass(frozen=True)
class _Written:
    """What a slice's committed transaction did."""

    plan: SlicePlan
    written: int
    postponed: int


def _write_part(
    conn: psycopg.Connection,
    claimed: Claimed,
    part: list[Claim],
    rows: Rows,
    config: BatchConfig,
    seconds: float,
    leases: Leases,
    done: _Progress,
    *,
    checked: bool = False,
) -> None:
    """_write_slice; a slice the table's own code refused (its transaction rolled back) is
    written again in halves, down to the refused rows alone: each of those fails an attempt in
    a transaction of its own (_refuse). A refusal while the table itself cannot be synced (gone,
    altered, a right revoked: trust.broken, asked at a slice's first refusal only, as its halves'
    rolled-back transactions cannot change it) is no row's fault: the error is raised, and the
    worker skips the model as for any batch failure."""
    try:
        _write_slice(conn, claimed, part, rows, config, seconds, leases, done)
    except Refused as exc:
        if not checked and trust.broken(conn, claimed.spec) is not None:
            raise exc.error from None
        if len(part) > 1:
            middle = len(part) // 2
            for half in (part[:middle], part[middle:]):
                share = seconds * len(half) / len(part)
                _write_part(conn, claimed, half, rows, config, share, leases, done, checked=True)
            return
        _refuse(conn, claimed.spec, part[0], str(exc), config, done)


def _refuse(
    conn: psycopg.Connection,
    spec: ModelSpec,
    claim: Claim,
    message: str,
    config: BatchConfig,
    done: _Progress,
) -> None:
    """A key whose write the table's own code refused: a failed attempt, with the refusal."""
    moved = store.fail(conn, spec.name, claim, f"write refused: {message}", config.max_attempts)
    done.refused += 1
    done.settled.add(claim.key)
    log.warning(
        "model=%s key=%s write refused%s: %s",
        spec.name,
        claim.key,
        " (moved to failures)" if moved else ", will retry",
        message,
    )


@contextmanager
def _refusals() -> Iterator[None]:
    """An error of the statement inside that may be its rows' (see _NOT_REFUSALS) is Refused."""
    try:
        yield
    except psycopg.Error as exc:
        state = exc.sqlstate  # by class alone: psycopg calls a trigger's stack overflow (54001)
        if state is None or state[:2] in _NOT_REFUSALS:  # or missing RETURN (2F005) operational
            raise
        raise Refused(exc) from exc


def _write_slice(
    conn: psycopg.Connection,
    claimed: Claimed,
    part: list[Claim],
    rows: Rows,
    config: BatchConfig,
    seconds: float,
    leases: Leases,
    done: _Progress,
) -> None:
    """One slice's transaction: give the batch back if the model changed, else apply its plan;
    after a write that ran another role's code (as the table's owner, or directly for an owner
    that may act as this role), the session is put right (clean_session)."""
    spec = claimed.spec
    owner: str | None = None
    foreign_code = False  # another role's code ran in this session: put it right after
    try:
        with conn.transaction():
            if _changed(conn, spec):
                # Ready again with this commit: the keys no slice completed or postponed (one
                # postponed may be another worker's claim by now).
                store.release(
                    conn, spec.name, [c for c in claimed.claims if c.key not in done.settled]
                )
                outcome = None
            else:
                store.wait_briefly(conn, WRITE_LOCK_TIMEOUT)
                found = trust.inspect(conn, spec)
                owner = found.owner if found is not None and found.writes_as_owner else None
                foreign_code = found is not None and found.runs_foreign_code
                outcome = _apply_slice(conn, spec, part, rows, config, seconds, leases, owner)
    finally:
        if foreign_code:
            store.clean_session(conn)
    if outcome is None:
        earlier = _result(claimed, len(done.settled), done.written, done.refused, done.postponed)
        raise ModelChanged(
            "changed since this worker read the catalog: batch given back",
            earlier if earlier.claimed else None,
        )
    done.add(outcome)


def _apply_slice(
    conn: psycopg.Connection,
    spec: ModelSpec,
    part: list[Claim],
    rows: Rows,
    config: BatchConfig,
    seconds: float,
    leases: Leases,
    owner: str | None,
) -> _Written:
    """In the slice's transaction: lock the rows of `part`'s keys that nobody holds, write the
    vectors of those whose text is unchanged, complete the keys (but failed ones), postpone the
    held ones, account. As the table's owner, the write comes last (store.write_as_owner)."""
    locking = to_lock(part, rows)
    plan = plan_slice(part, rows, locking, store.lock(conn, spec, *locking))
    vectors = rows.matrix[plan.positions]
    if owner is None:
        with _refusals():  # the table's triggers, rules and constraints run in this statement
            written = store.write(conn, spec, plan.keys, plan.md5s, vectors)
            # Deferred constraints and constraint triggers checked now, not at the commit
            # outside this block (write_as_owner does the same as the owner).
            conn.execute("SET CONSTRAINTS ALL IMMEDIATE")
    else:
        written = set(plan.keys)  # or none: write_as_owner fails the transaction
    if spec.chunked:
        store.write_chunks(conn, spec, written, rows.result.chunks)
    store.complete(conn, spec.name, plan.complete)
    postponed = _postpone(conn, spec.name, plan.busy, leases)
    truncated = written & set(rows.result.truncated)
    store.account(conn, spec.name, config.worker_id, list(written), list(truncated), seconds)
    if owner is not None:
        with _refusals():
            store.write_as_owner(conn, spec, owner, plan.keys, plan.md5s, vectors)
    return _Written(plan, len(written), postponed)


def _postpone(conn: psycopg.Connection, model: str, claims: list[Claim], leases: Leases) -> int:
    if not claims:
        return 0
    with leases.no_renewal():
        return store.postpone(
            conn, model, claims, BUSY_ROW_PAUSE_SECONDS, BUSY_ROW_MAX_PAUSE_SECONDS
        )


def release(conn: psycopg.Connection, claimed: Claimed) -> None:
    """Hand a batch that will not be embedded back to the queue at once."""
    store.release(conn, claimed.spec.name, claimed.claims)


def _changed(conn: psycopg.Connection, spec: ModelSpec) -> bool:
    """Whether the catalog no longer has the settings these vectors were made with.

    The share lock on the catalog row lasts until the write commits: a reindex switch takes that
    row FOR UPDATE before it swaps the column, so a write lands wholly before the swap, or is
    refused after it.
    """
    current = registry.locked(conn, spec.name)
    # A new key type (`pgembed alter-table`) changes the write's casts: reread the catalog too.
    return (
        current is None
        or not registry.same_space(current, spec)
        or current.key_type != spec.key_type
    )


def _record_failures(
    conn: psycopg.Connection,
    spec: ModelSpec,
    config: BatchConfig,
    claims: dict[str, Claim],
    result: Embedded,
) -> None:
    for row, error in result.failed:
        moved = store.fail(conn, spec.name, claims[row.key], error, config.max_attempts)
        log.warning(
            "model=%s key=%s failed%s: %s",
            spec.name,
            row.key,
            " (moved to failures)" if moved else ", will retry",
            error,
        )
