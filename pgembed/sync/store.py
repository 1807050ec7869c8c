"""Every statement of the sync path: claim, transfer, read, write back (a chunked model's windows
too), complete, release, fail, account, retry, count, renew, and the workers' LISTEN and
heartbeats. The batch, isolate, pipeline, leases and worker modules write no SQL (the NOTIFY that
wakes the workers is capture.notify's, as whatever queues keys sends it).

Static statements are named in sql/sync.sql; only the ones that name the user's table and columns
are composed here, with psycopg.sql.Identifier. Each call is one short transaction (or runs in the
caller's): no transaction stays open while a batch is embedded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import psycopg
from pgvector import Vector
from psycopg import sql

from pgembed import capture, defaults, sqlfiles
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


def claim_plan(conn: psycopg.Connection, model: str, limit: int) -> list[str]:
    """The plan `claim` runs with (EXPLAIN, nothing claimed): tests and the scale benchmark."""
    params = {"model": model, "worker": "", "limit": limit, "lease": 0}
    with conn.transaction():
        conn.execute(sqlfiles.get("sync", "claim_by_index"))
        rows = conn.execute("EXPLAIN " + sqlfiles.get("sync", "claim"), params).fetchall()
    return [str(row[0]) for row in rows]


def transfer(conn: psycopg.Connection, model: str, limit: int = 10_000) -> int:
    """Move captured inserts from the inbox to the queue; returns how many keys were moved."""
    cur = conn.execute(sqlfiles.get("sync", "transfer"), {"model": model, "limit": limit})
    return cur.rowcount


def read(conn: psycopg.Connection, spec: ModelSpec, keys: Sequence[str]) -> list[SourceRow]:
    """Rows that still exist and have non-blank text, with the md5 that guards the write-back;
    other keys simply do not come back.

    Only the text's first characters the model can read travel (one more tells a longer text):
    a 100 MB row never reaches Python whole. The md5 is still the whole text's."""
    further = defaults.CHUNK_CHARS_PER_WORD_PIECE * (spec.windows - 1)  # read more tightly
    chars = (defaults.CHARS_PER_WORD_PIECE + further) * spec.max_seq_length
    query = sql.SQL(
        "SELECT t.{key}::text, pg_catalog.left({text}, %s::integer), pg_catalog.md5({text}) "
        "FROM {table} t WHERE t.{key} OPERATOR(pg_catalog.=) ANY(%s::{type}[]) "
        "AND pgembed._has_text_v1(({text})::pg_catalog.text)"
    ).format(
        key=sql.Identifier(spec.key_column),
        text=naming.text_expression(spec, "t"),
        table=naming.table(spec),
        type=naming.key_type(spec),
    )
    rows = conn.execute(query, (chars + 1, list(keys)))
    return [SourceRow(key, text[:chars], md5, len(text) > chars) for key, text, md5 in rows]


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
    query = sql.SQL(
        "UPDATE {table} t SET {column} = v.embedding "
        "FROM ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::text[]), "
        "pg_catalog.unnest(%b)) AS v(key, text_md5, embedding) "
        "WHERE t.{key} OPERATOR(pg_catalog.=) v.key::{type} "
        "AND pg_catalog.md5({text}) OPERATOR(pg_catalog.=) v.text_md5 "
        "RETURNING v.key"
    ).format(
        table=naming.table(spec),
        column=sql.Identifier(spec.embedding_column),
        key=sql.Identifier(spec.key_column),
        text=naming.text_expression(spec, "t"),
        type=naming.key_type(spec),
    )
    params = (
        [keys[i] for i in order],
        [text_md5s[i] for i in order],
        [Vector(vectors[i]) for i in order],
    )
    with conn.transaction(), conn.cursor(binary=True) as cur:
        cur.execute("SELECT pg_catalog.set_config('pgembed.writing', 'on', true)")
        return {row[0] for row in cur.execute(query, params)}


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
        sql.SQL("DELETE FROM {} c WHERE c.key OPERATOR(pg_catalog.=) ANY(%s::{}[])").format(
            table, key_type
        ),
        (sorted(written),),
    )
    kept = sorted((c for c in chunks if c[0] in written), key=lambda c: (c[0], c[1]))
    if not kept:
        return
    query = sql.SQL(
        "INSERT INTO {} (key, chunk, embedding) "
        "SELECT v.key::{}, v.chunk, v.embedding "
        "FROM ROWS FROM (pg_catalog.unnest(%s::text[]), pg_catalog.unnest(%s::integer[]), "
        "pg_catalog.unnest(%b)) AS v(key, chunk, embedding)"
    ).format(table, key_type)
    params = ([c[0] for c in kept], [c[1] for c in kept], [Vector(c[2]) for c in kept])
    with conn.cursor(binary=True) as cur:
        cur.execute(query, params)


def _pairs(model: str, claims: Sequence[Claim]) -> dict[str, object]:
    return {"model": model, "keys": [c.key for c in claims], "seqs": [c.seq for c in claims]}


def complete(conn: psycopg.Connection, model: str, claims: Sequence[Claim]) -> None:
    conn.execute(sqlfiles.get("sync", "complete"), _pairs(model, claims))


def release(conn: psycopg.Connection, model: str, claims: Sequence[Claim]) -> None:
    conn.execute(sqlfiles.get("sync", "release"), _pairs(model, claims))


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
    waiting: int  # came in meanwhile: neither tried nor leased


def backlog(conn: psycopg.Connection, models: Sequence[str]) -> Backlog:
    row = conn.execute(sqlfiles.get("sync", "backlog"), {"models": list(models)}).fetchone()
    if row is None:
        return Backlog(0, 0, 0.0, 0, 0)
    retrying, orphaned, seconds, leased, waiting = row
    return Backlog(retrying, orphaned, max(0.0, seconds or 0.0), leased, waiting)


def require_primary(conn: psycopg.Connection) -> None:
    """Refuse a hot standby: a worker writes vectors and queue rows, which only a primary takes."""
    row = conn.execute(sqlfiles.get("sync", "in_recovery")).fetchone()
    if row and row[0]:
        raise ConfigError(
            "this database is a read-only hot standby: `pgembed sync` writes vectors, so run it "
            "against the primary (searches, `pgembed query`, `serve` and Client work on a standby)"
        )


def name_keeper(conn: psycopg.Connection, worker: str) -> None:
    """Name the lease keeper's session after its worker: how status tells it is alive."""
    conn.execute(sqlfiles.get("sync", "name_keeper"), {"worker": worker})


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
    conn: psycopg.Connection, worker: str, held: Sequence[tuple[str, Claim]], lease_seconds: float
) -> int:
    """Push the lease of the (model, claim) pairs this worker still holds forward; returns how
    many keys were renewed (completed, released or taken-over keys are left alone)."""
    params = {
        "models": [model for model, _ in held],
        "keys": [claim.key for _, claim in held],
        "seqs": [claim.seq for _, claim in held],
        "worker": worker,
        "lease": lease_seconds,
    }
    return conn.execute(sqlfiles.get("sync", "renew"), params).rowcount
