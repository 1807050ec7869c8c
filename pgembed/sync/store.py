"""Every statement of the sync path: claim, transfer, read, write back (a chunked model's windows
too), complete, release, fail, account, retry, count, renew, and the workers' LISTEN and
heartbeats. The batch, isolate, pipeline, leases and worker modules write no SQL (the NOTIFY that
wakes the workers is capture.notify's, as whatever queues keys sends it).

Static statements are named in sql/sync.sql; only the ones that name the user's table and columns
are composed here, with psycopg.sql.Identifier. Each call is one short transaction (or runs in the
caller's): no transaction stays open while a batch is embedded.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import psycopg
from pgvector import Vector
from psycopg import sql

from pgembed import capture, db, defaults, sqlfiles, texts
from pgembed.catalog import naming
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import ConfigError


@dataclass(frozen=True)
class Claim:
    key: str
    seq: int
    attempts: int


@dataclass(frozen=True)
class SourceRow:
    key: str
    text: str  # at most the characters the model reads (see read)
    text_md5: str  # of the whole text
    cut: bool = False  # the text was longer: the row is marked truncated


def claim(
    conn: psycopg.Connection, model: str, worker: str, limit: int, lease_seconds: float
) -> list[Claim]:
    """Lease up to `limit` ready keys, oldest first, in one short transaction whose plan reads
    the queue's index up to the limit, whatever its statistics say."""
    params = {"model": model, "worker": worker, "limit": limit, "lease": lease_seconds}
    with conn.transaction():
        conn.execute(sqlfiles.get("sync", "claim_by_index"))
        rows = conn.execute(sqlfiles.get("sync", "claim"), params).fetchall()
    return [Claim(key, seq, attempts) for key, seq, attempts in rows]


def transfer(conn: psycopg.Connection, model: str, limit: int = 10_000) -> int:
    """Move captured inserts from the inbox to the queue; returns how many keys were moved."""
    cur = conn.execute(sqlfiles.get("sync", "transfer"), {"model": model, "limit": limit})
    return cur.rowcount


def read(conn: psycopg.Connection, spec: ModelSpec, keys: Sequence[str]) -> list[SourceRow]:
    """Rows that still exist and have non-blank text, with the md5 that guards the write-back;
    other keys simply do not come back.

    Only the text's first characters the model can read travel (one more tells a longer text),
    from its first one that is not blank (see texts.py; the model skips those, so a text led by
    pages of white space would otherwise be read as blank): a 100 MB row never reaches Python
    whole. The md5 is still the whole text's."""
    further = defaults.CHUNK_CHARS_PER_WORD_PIECE * (spec.windows - 1)  # read more tightly
    chars = (defaults.CHARS_PER_WORD_PIECE + further) * spec.max_seq_length
    text = naming.text_expression(spec, "t")
    query = sql.SQL(
        "SELECT t.{key}::text, {first_word}, pg_catalog.md5({text}) "
        "FROM {table} t WHERE {matches} "
        "AND pgembed._has_text_v1(({text})::pg_catalog.text)"
    ).format(
        key=sql.Identifier(spec.key_column),
        text=text,
        first_word=texts.first_word_sql(text),
        table=naming.table(spec),
        matches=naming.key_in(spec, "t"),
    )
    with conn.transaction():
        row_security_errors(conn)
        args = (*texts.FIRST_WORD_PARAMS, chars + 1, list(keys))
        rows = conn.execute(query, args).fetchall()
    return [SourceRow(key, text[:chars], md5, len(text) > chars) for key, text, md5 in rows]


def row_security_errors(conn: psycopg.Connection) -> None:
    """For the rest of the transaction, a read of a table whose row-level security would filter
    it raises an error instead (row_security = off): a row the daemon cannot see must never look
    deleted (its key would be dropped), nor one `model add` cannot see go unqueued.
    catalog/trust.py says why and what to grant beforehand."""
    conn.execute("SELECT pg_catalog.set_config('row_security', 'off', true)")


@contextmanager
def rows_unfiltered(conn: psycopg.Connection) -> Iterator[None]:
    """row_security_errors for the statements inside, then row-level security filters again
    (the chunk tables' policy applies to the daemon; a user's statement runs under it)."""
    row_security_errors(conn)
    yield
    conn.execute("SELECT pg_catalog.set_config('row_security', 'on', true)")


def write(
    conn: psycopg.Connection,
    spec: ModelSpec,
    keys: Sequence[str],
    text_md5s: Sequence[str],
    vectors: np.ndarray,
) -> set[str]:
    """Write vectors where md5(text) still matches; returns the keys actually written.

    In the caller's transaction (or its own), flagged in pgembed.writing so the capture trigger
    does not take these vectors for ones written by hand. Sorted keys keep lock order stable between
    concurrent writers. Vectors travel in binary.
    """
    if not keys:  # (an empty list of vectors would travel without its type)
        return set()
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    rows = sql.SQL(
        "ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::text[]), "
        "pg_catalog.unnest(%b))"
    )
    query = sql.SQL("{} RETURNING v.key").format(_vector_update(spec, rows))
    params = (
        [keys[i] for i in order],
        [text_md5s[i] for i in order],
        [Vector(vectors[i]) for i in order],
    )
    with conn.transaction(), conn.cursor(binary=True) as cur:
        cur.execute("SELECT pg_catalog.set_config('pgembed.writing', 'on', true)")
        with rows_unfiltered(conn):  # a policy made since the read: fail, never write fewer
            return {row[0] for row in cur.execute(query, params)}


@dataclass(frozen=True)
class Locked:
    """What lock found: of each row it locked, whether md5(text) still matches; and the keys
    whose row another transaction holds (a key whose row is gone is in neither)."""

    same: dict[str, bool]
    held: set[str]


def lock(
    conn: psycopg.Connection, spec: ModelSpec, keys: Sequence[str], text_md5s: Sequence[str]
) -> Locked:
    """In the caller's transaction: lock the rows of `keys` that no other transaction holds, in
    key order, and say of each whether md5(text) still matches. A row another transaction holds
    (an application's open transaction updated, deleted or locked it) is skipped, not waited
    for: while the daemon waited, that transaction could go on to a row the daemon had locked,
    and PostgreSQL would end one of the two with `deadlock detected`. The locks keep the texts
    until the commit, so the write that follows (write, write_as_owner) finds each unchanged one.
    They are the UPDATE's own (FOR NO KEY UPDATE): a row that a transaction inserting rows that
    reference it holds (FOR KEY SHARE) is written, not skipped."""
    if not keys:
        return Locked({}, set())
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    query = sql.SQL(
        "SELECT v.key, (pg_catalog.md5({text}) OPERATOR(pg_catalog.=) v.text_md5) IS TRUE "
        "FROM {table} t "
        "JOIN ROWS FROM (pg_catalog.unnest(%s::pg_catalog.text[]), "
        "pg_catalog.unnest(%s::pg_catalog.text[])) AS v(key, text_md5) "
        "ON {matches} "
        "ORDER BY v.key FOR NO KEY UPDATE OF t SKIP LOCKED"
    ).format(
        table=naming.table(spec),
        text=naming.text_expression(spec, "t"),
        matches=_queued_key(spec),
    )
    params = ([keys[i] for i in order], [text_md5s[i] for i in order])
    with rows_unfiltered(conn):
        locked = {key: same for key, same in conn.execute(query, params)}
        skipped = [key for key in keys if key not in locked]
        held = _still_there(conn, spec, skipped) if skipped else set()
    return Locked(locked, held)


def _vector_update(spec: ModelSpec, rows: sql.Composable) -> sql.Composable:
    """The UPDATE that writes each of `rows` (key, text_md5, embedding) to its row whose
    md5(text) still matches: write's, and write_as_owner's as the owner."""
    return sql.SQL(
        "UPDATE {table} t SET {column} = v.embedding "
        "FROM {rows} AS v(key, text_md5, embedding) "
        "WHERE {matches} "
        "AND pg_catalog.md5({text}) OPERATOR(pg_catalog.=) v.text_md5"
    ).format(
        table=naming.table(spec),
        column=sql.Identifier(spec.embedding_column),
        rows=rows,
        matches=_queued_key(spec),
        text=naming.text_expression(spec, "t"),
    )


def _queued_key(spec: ModelSpec) -> sql.Composable:
    """A row's key matched to a queue key (`v.key`, text, as its type)."""
    return naming.key_is(spec, "t", sql.SQL("v.key::{}").format(naming.key_type(spec)))


def _still_there(conn: psycopg.Connection, spec: ModelSpec, keys: Sequence[str]) -> set[str]:
    """Of the keys SKIP LOCKED passed over, those whose row this statement still sees: held by
    another transaction. A row deleted (or its key changed) since the read is gone, not held:
    its key is done, not tried again as if it were locked."""
    query = sql.SQL(
        "SELECT v.key FROM pg_catalog.unnest(%s::pg_catalog.text[]) AS v(key) "
        "WHERE EXISTS (SELECT FROM {table} t "
        "WHERE {matches})"
    ).format(
        table=naming.table(spec),
        matches=_queued_key(spec),
    )
    return {key for (key,) in conn.execute(query, (list(keys),))}


def wait_briefly(conn: psycopg.Connection, timeout: str) -> None:
    """For the rest of the transaction, a lock wait longer than `timeout` fails the statement
    (lock_not_available): the write-back gives its batch back rather than wait for whatever an
    application's transaction holds (see lock)."""
    conn.execute("SELECT pg_catalog.set_config('lock_timeout', %s, true)", (timeout,))


def write_as_owner(
    conn: psycopg.Connection,
    spec: ModelSpec,
    owner: str,
    keys: Sequence[str],
    text_md5s: Sequence[str],
    vectors: np.ndarray,
) -> None:
    """Write vectors as the table's owner, in the caller's transaction, as its last statement:
    the owner's code runs in this session, which clean_session puts right after the commit.

    pgembed._write_as_owner_v1 (sql/definitions/40_sync.sql) runs this UPDATE through a
    SECURITY DEFINER function it gives to the owner, and fails the write where the owner's code
    kept a row out or left work that would run at the commit as the daemon."""
    if not keys:
        return
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    rows = sql.SQL(
        "ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3))"
    )
    query = sql.SQL("WITH w AS ({} RETURNING 1) SELECT pg_catalog.count(*) FROM w").format(
        _vector_update(spec, rows)
    )
    params = (
        owner,
        spec.qualified_table,
        query.as_string(conn),
        [keys[i] for i in order],
        [text_md5s[i] for i in order],
        [Vector(vectors[i]) for i in order],
    )
    with conn.cursor(binary=True) as cur:
        cur.execute(sqlfiles.get("sync", "write_as_owner"), params)


def clean_session(conn: psycopg.Connection) -> None:
    """After a write as a table's owner (committed or not): undo what the owner's code may have
    left in this session for the daemon's next statements to meet: settings (search_path ...),
    temporary objects (a type or table that would be found before pg_catalog's), prepared
    statements, listens, advisory locks, open cursors. The owner's writing function goes with
    them (sql/definitions/40_sync.sql)."""
    for statement in (
        "RESET ALL",
        "DISCARD TEMP",
        "DEALLOCATE ALL",
        "UNLISTEN *",
        "CLOSE ALL",
        "SELECT pg_catalog.pg_advisory_unlock_all()",
    ):
        conn.execute(statement)
    db.pin(conn)


def write_chunks(
    conn: psycopg.Connection,
    spec: ModelSpec,
    written: set[str],
    chunks: Sequence[tuple[str, int, np.ndarray]],
) -> None:
    """A chunked model's windows past the first, for the rows whose vector was just written (in
    that transaction: the row lock the write took keeps a concurrent writer of the same row out
    until this commits). Their old windows go first: a shorter text has fewer."""
    if not written:
        return
    table, key_type = naming.chunk_table(spec), naming.key_type(spec)
    conn.execute(
        sql.SQL("DELETE FROM {} c WHERE {}").format(table, naming.key_in(spec, "c", "key")),
        (sorted(written),),
    )
    windows = sorted((c for c in chunks if c[0] in written), key=lambda c: (c[0], c[1]))
    if not windows:
        return
    query = sql.SQL(
        "INSERT INTO {} (key, chunk, embedding) "
        "SELECT v.key::{}, v.chunk, v.embedding "
        "FROM ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::integer[]), "
        "pg_catalog.unnest(%b)) AS v(key, chunk, embedding)"
    ).format(table, key_type)
    params = ([c[0] for c in windows], [c[1] for c in windows], [Vector(c[2]) for c in windows])
    with conn.cursor(binary=True) as cur:
        cur.execute(query, params)


def _pairs(model: str, claims: Sequence[Claim]) -> dict[str, object]:
    return {"model": model, "keys": [c.key for c in claims], "seqs": [c.seq for c in claims]}


def complete(conn: psycopg.Connection, model: str, claims: Sequence[Claim]) -> None:
    conn.execute(sqlfiles.get("sync", "complete"), _pairs(model, claims))


def release(conn: psycopg.Connection, model: str, claims: Sequence[Claim]) -> None:
    conn.execute(sqlfiles.get("sync", "release"), _pairs(model, claims))


def postpone(
    conn: psycopg.Connection, model: str, claims: Sequence[Claim], least: float, most: float
) -> int:
    """Hand claimed keys back for a try after half the time each has been queued, from `least`
    to `most` seconds, not counted as a failed attempt: their rows were held by another
    transaction at the write-back. Never waits (sync.sql says why). Returns how many it handed
    back: a key whose row was deleted has no entry left, and one whose entry the application's
    transaction holds (its trigger queued the key anew) is left to it."""
    if not claims:
        return 0
    params = {**_pairs(model, claims), "least": least, "most": most}
    return conn.execute(sqlfiles.get("sync", "postpone"), params).rowcount


def fail(conn: psycopg.Connection, model: str, claim: Claim, error: str, max_attempts: int) -> bool:
    """Record a failed attempt; returns True when the key moved to the failures table."""
    params = {
        "model": model,
        "key": claim.key,
        "seq": claim.seq,
        "error": error[:2000],
        "max_attempts": max_attempts,
    }
    with conn.transaction():
        moved = conn.execute(sqlfiles.get("sync", "fail_final"), params).rowcount > 0
        if not moved:
            conn.execute(sqlfiles.get("sync", "fail_retry"), params)
    return moved


def account(
    conn: psycopg.Connection,
    model: str,
    worker: str,
    written: Sequence[str],
    truncated: Sequence[str],
    seconds: float,
) -> None:
    """After a write-back, in its transaction: written keys are no longer failures, their
    truncation marks are brought up to date, and the batch is logged for status's rows/s."""
    params = {"model": model, "keys": sorted(written)}
    conn.execute(sqlfiles.get("sync", "forget_failures"), params)
    conn.execute(sqlfiles.get("sync", "unmark_truncated"), params)
    conn.execute(
        sqlfiles.get("sync", "mark_truncated"), {"model": model, "keys": sorted(truncated)}
    )
    conn.execute(
        sqlfiles.get("sync", "log_batch"),
        {"model": model, "worker": worker, "rows": len(written), "seconds": seconds},
    )


def retry_failures(conn: psycopg.Connection, models: Sequence[str]) -> int:
    """Move failed keys back to the queue; returns how many."""
    with conn.transaction():
        count = conn.execute(sqlfiles.get("sync", "retry_failures"), {"models": list(models)})
        for model in models:
            capture.notify(conn, model)
    return count.rowcount


def has_ready(conn: psycopg.Connection, model: str) -> bool:
    """Whether the model has a key to claim now, or captured but not yet moved to the queue."""
    row = conn.execute(sqlfiles.get("sync", "has_ready"), {"model": model}).fetchone()
    return bool(row and row[0])


def queued_count(conn: psycopg.Connection, models: Sequence[str]) -> int:
    """Keys waiting in the queue or, captured but not yet moved, in the inbox."""
    row = conn.execute(sqlfiles.get("sync", "queued_count"), {"models": list(models)}).fetchone()
    return int(row[0]) if row else 0


@dataclass(frozen=True)
class Backlog:
    """Keys left in the queue after a `sync --once`, by why they are there."""

    retrying: int  # after a failure, at their next attempt
    orphaned: int  # leased by a worker that is gone (killed): ready when the lease ends
    orphaned_seconds: float  # until the last of those leases ends
    leased: int  # held by another worker that is still connected
    held: int  # their rows were held by another transaction at the write-back (postpone)
    held_seconds: float  # until the last of those is tried again
    waiting: int  # came in meanwhile: neither tried nor leased


def backlog(conn: psycopg.Connection, models: Sequence[str]) -> Backlog:
    row = conn.execute(sqlfiles.get("sync", "backlog"), {"models": list(models)}).fetchone()
    if row is None:
        return Backlog(0, 0, 0.0, 0, 0, 0.0, 0)
    retrying, orphaned, seconds, leased, held, held_seconds, waiting = row
    return Backlog(
        retrying,
        orphaned,
        max(0.0, seconds or 0.0),
        leased,
        held,
        max(0.0, held_seconds or 0.0),
        waiting,
    )


def require_primary(conn: psycopg.Connection) -> None:
    """Refuse a hot standby: a worker writes vectors and queue rows, which only a primary takes."""
    row = conn.execute(sqlfiles.get("sync", "in_recovery")).fetchone()
    if row and row[0]:
        raise ConfigError(
            "this database is a read-only hot standby: `pgembed sync` writes vectors, so run it "
            "against the primary (searches, `pgembed query`, `serve` and Client work on a standby)"
        )


def name_renewer(conn: psycopg.Connection, worker: str) -> None:
    """Name the lease renewer's session after its worker: how status tells it is alive."""
    conn.execute(sqlfiles.get("sync", "name_renewer"), {"worker": worker})


def listen(conn: psycopg.Connection) -> None:
    """Hear every NOTIFY that wakes the workers (capture.notify, the capture triggers)."""
    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(naming.CHANNEL)))


def heartbeat(
    conn: psycopg.Connection, worker: str, host: str, pid: int, models: Sequence[str]
) -> None:
    """Say this worker is alive, and prune old batch records and workers long gone."""
    conn.execute(
        sqlfiles.get("sync", "heartbeat"),
        {"worker": worker, "host": host, "pid": pid, "models": list(models)},
    )
    conn.execute(sqlfiles.get("sync", "prune"))


def release_worker(conn: psycopg.Connection, worker: str) -> None:
    """After a reconnect: claims the worker held before the fault are handed back at once."""
    conn.execute(sqlfiles.get("sync", "release_worker"), {"worker": worker})


def worker_exit(conn: psycopg.Connection, worker: str) -> None:
    conn.execute(sqlfiles.get("sync", "worker_exit"), {"worker": worker})


def renew(
    conn: psycopg.Connection, worker: str, leased: Sequence[tuple[str, Claim]], lease_seconds: float
) -> int:
    """Push the lease of the (model, claim) pairs this worker still holds forward; returns how
    many keys were renewed (completed, released or taken-over keys are left alone)."""
    params = {
        "models": [model for model, _ in leased],
        "keys": [claim.key for _, claim in leased],
        "seqs": [claim.seq for _, claim in leased],
        "worker": worker,
        "lease": lease_seconds,
    }
    return conn.execute(sqlfiles.get("sync", "renew"), params).rowcount
