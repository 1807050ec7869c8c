"""Per-model database objects on and beside the watched table: the vector column, the HNSW and
full-text indexes, a chunked model's chunk table; dropping them and a model's bookkeeping rows;
DDL that waits for its table's lock in short attempts.

The capture triggers are capture.py's and the daemon role's grants roles.py's: lifecycle/models.py
puts the three together (this module imports neither).

Every user identifier goes through psycopg.sql.Identifier; every value is a bound parameter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
from psycopg import sql

from pgembed import db, defaults, sqlfiles
from pgembed.catalog import naming, tables
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import DatabaseError, UsageError

log = logging.getLogger("pgembed.ddl")

T = TypeVar("T")
OnWait = Callable[[str], None]  # told one line each time a lock could not be had in time

# The text search configuration of the full-text index; the SQL helpers in migrations/0002 use
# the same expression, to_tsvector('english', text), so the planner can match it to the index.
FULLTEXT_CONFIG = "english"


def create(conn: psycopg.Connection, spec: ModelSpec, *, index: bool = True) -> None:
    """Column, index (unless `index` is False) and chunk table, inside the caller's transaction
    (the caller adds the capture triggers: see lifecycle/models.py)."""
    add_column(conn, spec)
    if index:
        create_index(conn, spec)
    create_chunks(conn, spec)


def create_chunks(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """A chunked model's table of windows past the first, beside the watched table, with its
    HNSW index (made empty: it grows as the daemon writes). No foreign key: the capture triggers
    clean it up, without a lock on the application's table per chunk written.

    Owned by the owner of pgembed's catalog, as the capture functions that clean it up run as
    that role and accept no other table (a trigger on it would run as them)."""
    if not spec.chunked:
        return
    name = naming.chunk_table_name(spec)
    if tables.exists(conn, spec.table_schema, name):
        raise UsageError(
            f"{spec.table_schema}.{name} exists: pgembed would keep model {spec.name}'s chunks "
            "there; rename that table, or choose another model name"
        )
    conn.execute(
        sql.SQL(
            "CREATE TABLE {table} (key {key_type} NOT NULL, chunk integer NOT NULL, "
            "embedding {vector}({dimensions}) NOT NULL, CONSTRAINT {pkey} PRIMARY KEY (key, chunk))"
        ).format(
            table=naming.chunk_table(spec),
            key_type=naming.key_type(spec),
            vector=db.vector_name(conn, "vector"),
            dimensions=sql.Literal(spec.dimensions),
            pkey=sql.Identifier(naming.chunk_key_name(spec)),
        )
    )
    follow_row_security(conn, spec)
    owner = conn.execute(sqlfiles.get("catalog", "pgembed_owner")).fetchone()
    if owner is not None and not owner[1]:
        try:
            with conn.transaction():
                conn.execute(
                    sql.SQL("ALTER TABLE {} OWNER TO {}").format(
                        naming.chunk_table(spec), sql.Identifier(owner[0])
                    )
                )
        except psycopg.errors.InsufficientPrivilege:
            raise UsageError(
                f"--long-texts chunk: add the model as {owner[0]} (who ran `pgembed migrate` "
                "and owns pgembed's catalog) or a member of that role: its chunk table must be "
                f"{owner[0]}'s"
            ) from None
    conn.execute(
        sql.SQL(
            "CREATE INDEX {name} ON {table} USING hnsw (embedding {opclass}) "
            "WITH (m = {m}, ef_construction = {ef})"
        ).format(
            name=sql.Identifier(naming.chunk_index_name(spec)),
            table=naming.chunk_table(spec),
            opclass=db.vector_name(conn, "vector_cosine_ops"),
            m=sql.Literal(spec.hnsw_m),
            ef=sql.Literal(spec.hnsw_ef_construction),
        )
    )


def follow_row_security(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """A role sees a chunk only while it may see the chunk's row and its vector: the policy's
    subquery reads the watched table's key and vector columns as the querying role, so that
    table's grants, column grants included, and row-level security apply (a role without SELECT
    on the vector column is refused the chunks, as it is the column). Its owner (pgembed's
    catalog's, as the capture functions that clean chunks up) is not subject to it. Migrations
    0015 and 0017 made the same on chunk tables made before. The policy depends on the vector
    column: the chunk table goes before it (models.drop_objects, switch)."""
    table = naming.chunk_table(spec)
    conn.execute(sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table))
    conn.execute(
        sql.SQL(
            "CREATE POLICY pgembed_row_visible ON {table} USING (EXISTS ("
            "SELECT t.{vector} FROM {source} t WHERE {matches}))"
        ).format(
            table=table,
            vector=sql.Identifier(spec.embedding_column),
            source=naming.table(spec),
            matches=naming.key_is(
                spec, "t", naming.key_at(spec, naming.chunk_table_name(spec), "key")
            ),
        )
    )


def unfollow_row_security(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """follow_row_security undone, for a statement that changes the key column's type: the
    policy names that column, so PostgreSQL refuses such a change while it is there. A policy
    already gone (dropped by hand) is no error: follow_row_security makes it again."""
    table = naming.chunk_table(spec)
    conn.execute(sql.SQL("DROP POLICY IF EXISTS pgembed_row_visible ON {}").format(table))
    conn.execute(sql.SQL("ALTER TABLE {} DISABLE ROW LEVEL SECURITY").format(table))


def add_column(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """The model's vector column, of its dimensions."""
    conn.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN {} {}({})").format(
            naming.table(spec),
            sql.Identifier(spec.embedding_column),
            db.vector_name(conn, "vector"),
            sql.Literal(spec.dimensions),
        )
    )


def create_index(
    conn: psycopg.Connection,
    spec: ModelSpec,
    *,
    concurrently: bool = False,
    name: str | None = None,
) -> None:
    """The model's HNSW index, under `name` when a rebuild needs a temporary one."""
    conn.execute(
        sql.SQL(
            "CREATE INDEX {concurrently} {name} ON {table} USING hnsw ({column} {opclass}) "
            "WITH (m = {m}, ef_construction = {ef})"
        ).format(
            concurrently=sql.SQL("CONCURRENTLY" if concurrently else ""),
            name=sql.Identifier(name or naming.index_name(spec)),
            table=naming.table(spec),
            column=sql.Identifier(spec.embedding_column),
            opclass=db.vector_name(conn, "vector_cosine_ops"),
            m=sql.Literal(spec.hnsw_m),
            ef=sql.Literal(spec.hnsw_ef_construction),
        )
    )


def create_fulltext_index(
    conn: psycopg.Connection, spec: ModelSpec, *, concurrently: bool = False
) -> None:
    """The GIN index hybrid search needs: an expression index on to_tsvector('english', text)."""
    conn.execute(
        sql.SQL(
            "CREATE INDEX {concurrently} IF NOT EXISTS {name} ON {table} "
            "USING gin (pg_catalog.to_tsvector({config}, {column}))"
        ).format(
            concurrently=sql.SQL("CONCURRENTLY" if concurrently else ""),
            name=sql.Identifier(naming.fulltext_index_name(spec)),
            table=naming.table(spec),
            config=sql.Literal(FULLTEXT_CONFIG),
            column=naming.text_expression(spec),
        )
    )
    if concurrently:  # not in a caller's transaction, which holds the table meanwhile
        # The index's word statistics, by which hybrid_search tells a common query (one most
        # rows match): ANALYZE takes them for an expression index, autovacuum only once enough
        # rows changed. A sample of 30,000 rows at most.
        conn.execute(sql.SQL("ANALYZE {}").format(naming.table(spec)))


def drop_invalid_fulltext_index(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """A failed CREATE INDEX CONCURRENTLY leaves an invalid index that IF NOT EXISTS would keep."""
    if index_valid(conn, spec.table_schema, naming.fulltext_index_name(spec)) is False:
        drop_concurrently(conn, spec.table_schema, naming.fulltext_index_name(spec))


def index_valid(conn: psycopg.Connection, schema: str, name: str) -> bool | None:
    """True for a usable index, False for one an interrupted build left invalid, None if none."""
    query = sqlfiles.get("catalog", "index_valid")
    row = conn.execute(query, {"schema": schema, "name": name}).fetchone()
    return None if row is None else bool(row[0])


def drop_concurrently(conn: psycopg.Connection, schema: str, name: str) -> None:
    conn.execute(
        sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(schema, name))
    )


def retrying_locks(
    conn: psycopg.Connection,
    schema: str,
    name: str,
    work: Callable[[], T],
    on_wait: OnWait | None = None,
    *,
    wait_seconds: float = defaults.DDL_LOCK_WAIT_SECONDS,
) -> T:
    """Run `work` (DDL on table schema.name) in one transaction whose lock waits last at most
    DDL_LOCK_TIMEOUT: a waiting ACCESS EXCLUSIVE request queues every other query on the table
    behind it. A timed-out attempt is rolled back whole, then tried again after a pause."""
    say = on_wait or log.warning
    deadline = time.monotonic() + wait_seconds
    pause = defaults.DDL_RETRY_FIRST_PAUSE
    while True:
        cancel_autovacuum(conn, schema, name)
        try:
            with conn.transaction():
                _lock_timeout(conn, defaults.DDL_LOCK_TIMEOUT)
                return work()
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
            holders = _lock_holders(conn, schema, name)
            if time.monotonic() + pause > deadline:
                raise DatabaseError(
                    f"gave up after {wait_seconds:g} s waiting for a lock on table "
                    f"{schema}.{name}{holders}: end that transaction and run the command again"
                ) from None
            say(f"waiting for a lock on table {schema}.{name}{holders}; trying again")
            time.sleep(pause)
            pause = min(pause * 2, defaults.DDL_RETRY_MAX_PAUSE)


def cancel_autovacuum(conn: psycopg.Connection, schema: str, name: str) -> None:
    """An autovacuum of the table would hold our lock request, and every query queued behind
    it, until PostgreSQL cancels it after deadlock_timeout (1 s: the writers' one stall measured
    at a million rows): cancel it first, where this role may."""
    try:
        with conn.transaction():
            query = sqlfiles.get("catalog", "cancel_autovacuum")
            row = conn.execute(query, {"schema": schema, "name": name}).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        return  # PostgreSQL cancels it after deadlock_timeout
    if row and row[0]:
        log.info("cancelled the autovacuum of %s.%s (pid %s)", schema, name, row[0])
        time.sleep(0.05)  # it releases its lock as it stops


def _lock_holders(conn: psycopg.Connection, schema: str, name: str) -> str:
    """` (held by pid N, M)` for the sessions holding a lock on the table, or nothing."""
    query = sqlfiles.get("catalog", "table_lock_holders")
    row = conn.execute(query, {"schema": schema, "name": name}).fetchone()
    pids = row[0] if row and row[0] else []
    return f" (held by pid {', '.join(map(str, pids))})" if pids else ""


def refuse_column_views(conn: psycopg.Connection, spec: ModelSpec, action: str) -> None:
    """A view on the model's column, or on a chunked model's chunk table, would make `action`,
    which drops them, fail at its end (a reindex's switch, after every row was embedded again):
    say so before anything starts."""
    dropped: list[tuple[str, str | None]] = [(spec.table_name, spec.embedding_column)]
    if spec.long_texts == "chunk":
        dropped.append((naming.chunk_table_name(spec), None))
    for relation, column in dropped:
        found = conn.execute(
            sqlfiles.get("catalog", "column_views"),
            {"schema": spec.table_schema, "table": relation, "column": column},
        ).fetchall()
        if found:
            what = f"column {column} of" if column else "table"
            views = ", ".join(row[0] for row in found)
            many = len(found) > 1
            raise UsageError(
                f"{action} drops {what} {spec.table_schema}.{relation}, which "
                f"{'views' if many else 'view'} {views} {'read' if many else 'reads'}: drop "
                f"{'them' if many else 'it'}, or make {'them' if many else 'it'} again without "
                f"that {'column' if column else 'table'}, first"
            )


def lock_table(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """Take the table's ACCESS EXCLUSIVE lock first, so a timeout leaves nothing half-done."""
    conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(naming.table(spec)))


def lock_chunks(conn: psycopg.Connection, specs: list[ModelSpec]) -> None:
    """The chunk tables' ACCESS EXCLUSIVE locks, after the watched table's (in retrying_locks):
    their autovacuum cancelled first, and each waited for at most CHUNK_LOCK_TIMEOUT, so that a
    session holding a chunk table and waiting for the watched table is not the deadlock's
    victim: this transaction gives up and is tried again instead."""
    for spec in specs:
        cancel_autovacuum(conn, spec.table_schema, naming.chunk_table_name(spec))
    _lock_timeout(conn, defaults.CHUNK_LOCK_TIMEOUT)
    for spec in specs:
        conn.execute(
            sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(naming.chunk_table(spec))
        )
    _lock_timeout(conn, defaults.DDL_LOCK_TIMEOUT)


def _lock_timeout(conn: psycopg.Connection, value: str) -> None:
    """For the rest of the transaction (SET LOCAL)."""
    conn.execute("SELECT pg_catalog.set_config('lock_timeout', %s, true)", (value,))


def drop_chunks(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """A chunked model's chunk table, if it is pgembed's: a table of that name that is not (the
    user's, or one put there after pgembed's was dropped) is left alone."""
    if spec.chunked and tables.own_chunks(conn, spec.table_schema, naming.chunk_table_name(spec)):
        conn.execute(sql.SQL("DROP TABLE {}").format(naming.chunk_table(spec)))


def drop_objects(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """The model's indexes and column, of those that exist (its capture triggers, which watch the
    column, and the daemon role's grants on it go first: see lifecycle/models.py)."""
    table = naming.table(spec)
    for index in (naming.index_name(spec), naming.fulltext_index_name(spec)):
        conn.execute(
            sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(spec.table_schema, index))
        )
    conn.execute(
        sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS {}").format(
            table, sql.Identifier(spec.embedding_column)
        )
    )


def forget(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """The model's queue, inbox, failures, truncation and batch records."""
    for bookkeeping in ("queue", "inbox", "failures", "truncated", "batches"):
        conn.execute(
            sql.SQL("DELETE FROM pgembed.{} WHERE model = %s").format(sql.Identifier(bookkeeping)),
            (spec.name,),
        )
