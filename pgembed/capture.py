"""Change capture: the triggers that queue a model's keys when its text changes.

The trigger functions themselves are SQL (sql/definitions/20_capture.sql): an INSERT or
TRUNCATE is one statement-level trigger, an UPDATE of the key or text (or a vector written by
hand) a row trigger that also clears the stale vector, a DELETE removes the keys' queue
entries, and a row inserted with a vector (by hand) has it cleared. The worker's own vector
writes enqueue nothing. A chunked model's triggers also clear the chunks of a row whose vector
they clear, of deleted rows, and of a truncated table.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pgembed import roles, sqlfiles
from pgembed.catalog import naming
from pgembed.catalog.registry import ModelSpec


def create_triggers(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """The five triggers, firing ALWAYS: also under session_replication_role = replica (logical
    replication subscribers, restores), where a trigger of the default kind is skipped and the
    old vector would be served for the new text. Migration 0007 made the same for old models'
    four first ones; lifecycle/setup.py guard_older_models adds the fifth at `pgembed migrate`.
    The daemon role, when there is one, may then read the key and text and write the vector."""
    names = naming.trigger_names(spec)
    ins, upd, dele, trunc, _ = (sql.Identifier(n) for n in names)
    table = naming.table(spec)
    # The text columns travel as one argument, comma-separated (identifiers hold no comma).
    args = sql.SQL(", ").join(
        sql.Literal(v) for v in (spec.name, spec.key_column, ",".join(spec.text_columns))
    )
    # A chunked model's triggers also name its chunk table (quoted, as to_regclass reads it).
    chunks = (
        sql.SQL(", {}").format(sql.Literal(naming.chunk_table(spec).as_string(conn)))
        if spec.chunked
        else sql.SQL("")
    )
    key, vector = sql.Identifier(spec.key_column), sql.Identifier(spec.embedding_column)
    texts = [sql.Identifier(c) for c in spec.text_columns]
    watched = sql.SQL(", ").join([key, *texts])
    old, new = (
        sql.SQL(", ").join(sql.SQL("{}.{}").format(sql.SQL(side), c) for c in (key, *texts))
        for side in ("OLD", "NEW")
    )
    statements = [
        sql.SQL(
            "CREATE TRIGGER {} AFTER INSERT ON {} REFERENCING NEW TABLE AS pgembed_new "
            "FOR EACH STATEMENT EXECUTE FUNCTION pgembed.capture_insert_v1({})"
        ).format(ins, table, args),
        # A new key or text (any of its columns), or a vector written by anyone but the sync
        # worker (which flags its writes in pgembed.writing) or a replication apply. Compared
        # by binary image: no `=` looked up through search_path, no text rendered under the
        # writer's settings (0.1 and 0.10000000000000002 are one text at extra_float_digits 0).
        sql.SQL(
            "CREATE TRIGGER {upd} BEFORE UPDATE OF {watched}, {vector} ON {table} FOR EACH ROW "
            "WHEN (NOT pg_catalog.record_image_eq(ROW({old}), ROW({new})) "
            "OR (NOT pg_catalog.record_image_eq(ROW(OLD.{vector}), ROW(NEW.{vector})) "
            "AND pg_catalog.current_setting('pgembed.writing', true) IS DISTINCT FROM 'on' "
            "AND pg_catalog.current_setting('session_replication_role') <> 'replica')) "
            "EXECUTE FUNCTION pgembed.capture_update_v1({args}, {column}{chunks})"
        ).format(
            upd=upd,
            watched=watched,
            vector=vector,
            table=table,
            old=old,
            new=new,
            args=args,
            column=sql.Literal(spec.embedding_column),
            chunks=chunks,
        ),
        sql.SQL(
            "CREATE TRIGGER {} AFTER DELETE ON {} REFERENCING OLD TABLE AS pgembed_old "
            "FOR EACH STATEMENT EXECUTE FUNCTION pgembed.capture_delete_v1({}{})"
        ).format(dele, table, args, chunks),
        sql.SQL(
            "CREATE TRIGGER {} AFTER TRUNCATE ON {} "
            "FOR EACH STATEMENT EXECUTE FUNCTION pgembed.capture_truncate_v1({}{})"
        ).format(trunc, table, args, chunks),
    ]
    statements += [
        sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}").format(table, sql.Identifier(name))
        for name in names[:4]
    ]
    for statement in statements:
        conn.execute(statement)
    guard_vectors(conn, spec)
    roles.grant_table(conn, spec)


def guard_vectors(conn: psycopg.Connection, spec: ModelSpec) -> bool:
    """The fifth trigger (made again if older, firing ALWAYS): a vector an INSERT brings, and
    any write of the vector column under pgembed.writing, go through capture_insert_vector_v1
    (which clears the one, and refuses the other to a role it does not honour); its WHEN lets
    every unflagged row without a vector, a bulk COPY's rows, pass without a call. False on a
    schema older than that function, where `pgembed migrate` makes the trigger later
    (lifecycle/setup.py guard_older_models)."""
    defined = conn.execute(
        "SELECT pg_catalog.to_regprocedure('pgembed.capture_insert_vector_v1()') IS NOT NULL"
    ).fetchone()
    if not defined or not defined[0]:
        return False
    table, vector = naming.table(spec), sql.Identifier(spec.embedding_column)
    trigger = sql.Identifier(naming.trigger_names(spec)[4])
    conn.execute(
        sql.SQL(
            "CREATE OR REPLACE TRIGGER {trigger} BEFORE INSERT OR UPDATE OF {vector} ON {table} "
            "FOR EACH ROW WHEN ((NEW.{vector} IS NOT NULL "
            "OR pg_catalog.current_setting('pgembed.writing', true) = 'on') "
            "AND pg_catalog.current_setting('session_replication_role') <> 'replica') "
            "EXECUTE FUNCTION pgembed.capture_insert_vector_v1({model}, {column})"
        ).format(
            trigger=trigger,
            vector=vector,
            table=table,
            model=sql.Literal(spec.name),
            column=sql.Literal(spec.embedding_column),
        )
    )
    conn.execute(sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}").format(table, trigger))
    return True


def drop_triggers(conn: psycopg.Connection, spec: ModelSpec) -> None:
    table = naming.table(spec)
    for name in naming.trigger_names(spec):
        conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(name), table))


def enqueue_existing(conn: psycopg.Connection, spec: ModelSpec) -> int:
    """Queue every row that has text; returns how many were queued."""
    cur = conn.execute(
        sql.SQL(
            "INSERT INTO pgembed.queue (model, key) "
            "SELECT %s, {key}::pg_catalog.text FROM {table} "
            "WHERE {key} IS NOT NULL AND pgembed._has_text_v1(({text})::pg_catalog.text) "
            "ON CONFLICT (model, key) DO NOTHING"
        ).format(
            key=sql.Identifier(spec.key_column),
            table=naming.table(spec),
            text=naming.text_expression(spec),
        ),
        (spec.name,),
    )
    notify(conn, spec.name)
    return cur.rowcount


def notify(conn: psycopg.Connection, model: str) -> None:
    """Wake the workers: `model` has keys to embed (or is new to them). The one NOTIFY of the
    Python side (the capture triggers send their own); it is sent when the transaction commits."""
    conn.execute(sqlfiles.get("sync", "notify"), {"channel": naming.CHANNEL, "model": model})
