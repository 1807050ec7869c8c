"""`pgembed alter-table`: a statement of the user's (e.g. a watched column's new type) run with
the capture triggers of the table's models lifted around it, in one transaction.

PostgreSQL refuses `ALTER COLUMN ... TYPE` and `DROP COLUMN` of a column a trigger names, and a
model's update trigger names its key and text columns. Removing the model and adding it again
would embed every row anew; this keeps the vectors. The texts are fingerprinted (md5) before the
statement: a row whose text the statement changed (a shorter varchar, a char(n)'s padding) has
its vector cleared and its key queued, as the update trigger would have done.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgembed import capture, db, sqlfiles
from pgembed.catalog import ddl, naming, registry, tables
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import NotFoundError, UsageError
from pgembed.sync import store

# The user's statement, bound as a value and run by PL/pgSQL's EXECUTE: in the connection's
# encoding, several statements at once, and PostgreSQL itself refuses a COMMIT or ROLLBACK in it
# (which would commit the triggers' drop without the rest).
_RUN = (
    "DO $run$ BEGIN EXECUTE pg_catalog.current_setting('pgembed.alter_table_statement'); END $run$"
)
# Fingerprints of the rows before the statement: one row per model and key, gone at commit.
_BEFORE = sql.Identifier("pg_temp", "pgembed_alter_table_before")


@dataclass(frozen=True)
class Altered:
    schema: str
    table: str
    models: list[str]
    requeued: dict[str, int]  # model -> rows whose text the statement changed
    key_types: dict[str, tuple[str, str]]  # model -> (old, new) key type, where it changed


def alter_table(
    conn: psycopg.Connection, table: str, statement: str, on_wait: ddl.OnWait | None = None
) -> Altered:
    """Run `statement` on an autocommit `conn` with the triggers of every model watching `table`
    (a reindex's shadow too), and a chunked model's row policy on its chunks, dropped before it
    and made again after it, in one transaction."""
    schema, name = naming.parse_table(table)
    if not statement.strip():
        raise UsageError(
            "give the statement to run, e.g. 'ALTER TABLE t ALTER COLUMN body TYPE text'"
        )

    def watching() -> list[ModelSpec]:
        every = registry.all_models(conn)
        return [s for s in every if (s.table_schema, s.table_name) == (schema, name)]

    def work() -> Altered:
        specs = watching()
        if not specs:
            raise UsageError(
                f"no model watches table {schema}.{name}: run the statement yourself (`pgembed "
                "model list` shows the tables pgembed watches)"
            )
        # Catalog rows first, then the table: the sync write-back's order (no deadlock). From
        # here no daemon writes a vector of these models until the commit: one written after
        # the fingerprints read as the statement's change, and its row was cleared and queued.
        for spec in specs:
            conn.execute(sqlfiles.get("lifecycle", "lock_model_rows"), {"name": spec.name})
        # Read again under those locks: another alter-table's new key type, a reindex's switch.
        locked, specs = specs, watching()
        if [s.name for s in specs] != [s.name for s in locked]:
            raise UsageError(
                f"the models of table {schema}.{name} changed while pgembed waited for them "
                "(a model added, removed or switched): nothing changed, run it again"
            )
        # The fingerprints before the table's lock, which would stop the application for their
        # read of every row (some 6 s at a million; the daemons wait meanwhile). The triggers
        # are still there: a row the application changes meanwhile is queued by its trigger,
        # and found changed below too.
        with store.rows_unfiltered(conn):
            _fingerprint(conn, specs)
        ddl.lock_table(conn, specs[0])
        chunked = [s for s in specs if _has_chunks(conn, s)]
        ddl.lock_chunks(conn, chunked)
        before = tables.inspect(conn, schema, name)
        for spec in specs:
            capture.drop_triggers(conn, spec)
        for spec in chunked:  # a chunk table's row policy names the key column too
            ddl.unfollow_row_security(conn, spec)
        try:
            conn.execute(
                "SELECT pg_catalog.set_config('pgembed.alter_table_statement', %s, true)",
                (statement,),
            )
            conn.execute(_RUN)
        except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected):
            raise  # retrying_locks tries the whole transaction again
        except psycopg.Error as exc:
            raise UsageError(
                f"the statement failed, nothing changed: {db.first_line(exc)}"
            ) from None
        except UnicodeError:
            raise UsageError("the statement is not valid text: nothing changed") from None
        # A SET in the statement must not change how keys are written as text for the compare
        # and the queue (the session's canonical form, as the triggers write them).
        conn.execute(sqlfiles.get("session", "pin"))
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
            raise UsageError(
                f"the statement ended pgembed's transaction, so the capture triggers may be "
                f"missing: `pgembed alter-table {table} 'SELECT 1'` makes them again"
            )
        try:
            after = tables.inspect(conn, schema, name)
        except NotFoundError:
            raise UsageError(
                f"the statement dropped, renamed or moved table {schema}.{name}; rolled back "
                f"(`pgembed model remove` its models first: {', '.join(s.name for s in specs)})"
            ) from None
        changed: dict[str, tuple[str, str]] = {}
        requeued: dict[str, int] = {}
        for spec in specs:
            new = _checked(conn, before, after, spec)
            if new.key_type != spec.key_type:
                changed[spec.name] = (spec.key_type, new.key_type)
                conn.execute(
                    sqlfiles.get("catalog", "set_key_type"),
                    {"name": spec.name, "key_type": new.key_type},
                )
            chunks = spec in chunked
            with store.rows_unfiltered(conn):
                if chunks:
                    _chunks_follow_keys(conn, spec, new)
                requeued[spec.name] = _requeue_changed(conn, new, chunks=chunks)
            if chunks:
                ddl.follow_row_security(conn, new)
            capture.create_triggers(conn, new)
            capture.notify(conn, new.name)
        return Altered(schema, name, [s.name for s in specs], requeued, changed)

    return ddl.retrying_locks(conn, schema, name, work, on_wait)


def _checked(
    conn: psycopg.Connection, before: tables.TableInfo, after: tables.TableInfo, spec: ModelSpec
) -> ModelSpec:
    """The model as the statement left its table: its columns still there, its texts still
    text, its key still usable (and compared as its type now is); else an error that rolls the
    statement back."""
    where = f"model {spec.name}"
    for column in (spec.key_column, spec.embedding_column):
        if column not in after.columns:
            raise UsageError(
                f"{where}: column {column!r} is gone after the statement; rolled back "
                f"(`pgembed model remove {spec.name}` first to drop or rename it)"
            )
    vector = spec.embedding_column
    if after.columns[vector] != before.columns.get(vector):
        raise UsageError(
            f"{where}: the statement changed pgembed's column {vector!r} "
            f"({before.columns.get(vector)} to {after.columns[vector]}); rolled back "
            f"(`pgembed model alter {spec.name}` changes a model's vectors)"
        )
    for column in spec.text_columns:
        try:
            tables.text_column(after, column)
        except (UsageError, NotFoundError) as exc:
            raise UsageError(f"{where}: {exc}; rolled back") from None
    try:
        tables.key_column(after, spec.key_column)  # still unique, NOT NULL, trusted
    except (UsageError, NotFoundError) as exc:
        raise UsageError(f"{where}: {exc}; rolled back") from None
    key_type = after.columns[spec.key_column]
    return registry.keyed(conn, dataclasses.replace(spec, key_type=key_type))


def _fingerprint(conn: psycopg.Connection, specs: list[ModelSpec]) -> None:
    conn.execute(
        sql.SQL(
            "CREATE TEMPORARY TABLE {} (model pg_catalog.text, key pg_catalog.text, "
            "prints pg_catalog.text, PRIMARY KEY (model, key)) ON COMMIT DROP"
        ).format(_BEFORE)
    )
    for spec in specs:
        conn.execute(
            sql.SQL(
                "INSERT INTO {before} SELECT %s, t.{key}::pg_catalog.text, {prints} "
                "FROM {table} t WHERE t.{key} IS NOT NULL"
            ).format(
                before=_BEFORE,
                key=sql.Identifier(spec.key_column),
                prints=_prints(conn, spec),
                table=naming.table(spec),
            ),
            (spec.name,),
        )


def _prints(conn: psycopg.Connection, spec: ModelSpec) -> sql.Composable:
    """A row's text and vector, as one md5 pair (`-` for NULL): a vector the statement changed
    or cleared is a changed row too, as for the update trigger. The vector by its binary form
    (vector_send): no float text rendered for each of a million rows."""
    return sql.SQL(
        "pg_catalog.concat(coalesce(pg_catalog.md5({text}), '-'), ' ', "
        "coalesce(pg_catalog.md5({send}(t.{vector})), '-'))"
    ).format(
        text=naming.text_expression(spec, "t"),
        send=db.vector_name(conn, "vector_send"),
        vector=sql.Identifier(spec.embedding_column),
    )


def _chunks_follow_keys(conn: psycopg.Connection, old: ModelSpec, new: ModelSpec) -> None:
    """A chunked model's chunks: those of keys no row has now (deleted, rekeyed, or written
    otherwise by a new key type) go, as the delete trigger does; with a new key type the rest
    take it. Each kept chunk's key is then some row's key as text, so it reads back as exactly
    that row's key: a chunk never moves to another row, and the cast cannot fail."""
    key, chunks = sql.Identifier(new.key_column), naming.chunk_table(new)
    conn.execute(
        sql.SQL(
            "DELETE FROM {chunks} c WHERE NOT EXISTS (SELECT FROM {table} t "
            "WHERE t.{key}::pg_catalog.text OPERATOR(pg_catalog.=) c.key::pg_catalog.text)"
        ).format(chunks=chunks, table=naming.table(new), key=key)
    )
    if new.key_type != old.key_type:
        _retype_chunk_keys(conn, new)


def _retype_chunk_keys(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """The chunk keys in the new key type, by their text. The type's own cast where it gives
    every key that same value, as PostgreSQL then rewrites only what it must (`varchar(32)` to
    `varchar(64)`: nothing; a USING clause would rewrite the table and rebuild its HNSW index
    under the watched table's lock)."""
    chunks, key_type = naming.chunk_table(spec), naming.key_type(spec)
    try:
        with conn.transaction():
            differs = conn.execute(
                sql.SQL(
                    "SELECT EXISTS (SELECT FROM {} c WHERE c.key::{} IS DISTINCT FROM "
                    "c.key::pg_catalog.text::{})"
                ).format(chunks, key_type, key_type)
            ).fetchone()
            if differs == (False,):
                conn.execute(
                    sql.SQL("ALTER TABLE {} ALTER COLUMN key TYPE {}").format(chunks, key_type)
                )
                return
    except (psycopg.errors.DatatypeMismatch, psycopg.errors.CannotCoerce, psycopg.DataError):
        pass  # no such cast, or one that fails for a key: by the text alone
    conn.execute(
        sql.SQL("ALTER TABLE {} ALTER COLUMN key TYPE {} USING key::pg_catalog.text::{}").format(
            chunks, key_type, key_type
        )
    )


def _has_chunks(conn: psycopg.Connection, spec: ModelSpec) -> bool:
    """A chunked model whose chunk table is there and pgembed's (else it has none to follow)."""
    name = naming.chunk_table_name(spec)
    return spec.chunked and tables.own_chunks(conn, spec.table_schema, name)


def _requeue_changed(conn: psycopg.Connection, spec: ModelSpec, *, chunks: bool) -> int:
    """What the update trigger does for a changed row, for the rows whose key, text or vector
    the statement changed: the vector (and chunks) cleared, the key queued if it has text, else
    its bookkeeping dropped; and the bookkeeping of keys no row has now. How many were queued."""
    key, table = sql.Identifier(spec.key_column), naming.table(spec)
    text = naming.text_expression(spec, "t")
    rows = conn.execute(
        sql.SQL(
            "SELECT t.{key}::pg_catalog.text, pgembed._has_text_v1(({text})::pg_catalog.text) "
            "FROM {table} t WHERE t.{key} IS NOT NULL AND NOT EXISTS (SELECT FROM {before} b "
            "WHERE b.model OPERATOR(pg_catalog.=) %s "
            "AND b.key OPERATOR(pg_catalog.=) t.{key}::pg_catalog.text "
            "AND b.prints OPERATOR(pg_catalog.=) {prints})"
        ).format(key=key, text=text, table=table, before=_BEFORE, prints=_prints(conn, spec)),
        (spec.name,),
    ).fetchall()
    # Keys no row has now: the fingerprinted ones the statement deleted or rekeyed, and any the
    # queues hold in a spelling the new key type no longer writes (a row inserted after the
    # fingerprints: its key queued as 5001.00 when the column became bigint). The daemon could
    # not even read those; the row itself is queued above under its new spelling.
    gone = conn.execute(
        sql.SQL(
            "SELECT k FROM (SELECT b.key FROM {before} b WHERE b.model OPERATOR(pg_catalog.=) %s "
            "UNION SELECT q.key FROM pgembed.queue q WHERE q.model OPERATOR(pg_catalog.=) %s "
            "UNION SELECT i.key FROM pgembed.inbox i WHERE i.model OPERATOR(pg_catalog.=) %s "
            "UNION SELECT f.key FROM pgembed.failures f WHERE f.model OPERATOR(pg_catalog.=) %s "
            "UNION SELECT r.key FROM pgembed.truncated r WHERE r.model OPERATOR(pg_catalog.=) %s"
            ") AS pending(k) WHERE NOT EXISTS (SELECT FROM {table} t "
            "WHERE t.{key}::pg_catalog.text OPERATOR(pg_catalog.=) pending.k)"
        ).format(before=_BEFORE, table=table, key=key),
        (spec.name,) * 5,
    ).fetchall()
    changed = [k for k, _ in rows]
    if changed:
        # By the key's own type, as the daemon's write does: the key index finds the few rows.
        conn.execute(
            sql.SQL(
                "UPDATE {table} t SET {vector} = NULL WHERE {vector} IS NOT NULL AND {matches}"
            ).format(
                table=table,
                vector=sql.Identifier(spec.embedding_column),
                matches=naming.key_in(spec, "t"),
            ),
            (changed,),
        )
        if chunks:
            conn.execute(
                sql.SQL("DELETE FROM {} c WHERE {}").format(
                    naming.chunk_table(spec),
                    naming.key_in(spec, "c", "key"),
                ),
                (changed,),
            )
    queued = [k for k, has_text in rows if has_text]
    forgotten = [k for k, has_text in rows if not has_text] + [k for (k,) in gone]
    params = {"model": spec.name, "queued": queued, "forgotten": forgotten}
    for statement in sqlfiles.statements("lifecycle", "requeue_keys"):
        conn.execute(statement, params)
    return len(queued)
