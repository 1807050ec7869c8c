"""Change capture: the triggers that queue a model's keys when its text changes.

The trigger functions themselves are SQL (sql/schema/20_capture.sql): an INSERT or TRUNCATE is one
statement-level trigger, an UPDATE of the text column a row trigger that also clears the stale
vector, a DELETE removes the keys' queue entries. Only the text column's changes fire: the
worker's own vector writes enqueue nothing.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pgembed.catalog import naming
from pgembed.catalog.registry import ModelSpec


def create_triggers(conn: psycopg.Connection, spec: ModelSpec) -> None:
    ins, upd, dele, trunc = (sql.Identifier(n) for n in naming.trigger_names(spec))
    table = naming.table(spec)
    args = sql.SQL(", ").join(
        sql.Literal(v) for v in (spec.name, spec.key_column, spec.text_column)
    )
    text = sql.Identifier(spec.text_column)
    statements = [
        sql.SQL(
            "CREATE TRIGGER {} AFTER INSERT ON {} REFERENCING NEW TABLE AS pgembed_new "
            "FOR EACH STATEMENT EXECUTE FUNCTION pgembed.capture_insert_v1({})"
        ).format(ins, table, args),
        sql.SQL(
            "CREATE TRIGGER {} BEFORE UPDATE OF {} ON {} FOR EACH ROW "
            "WHEN (OLD.{} IS DISTINCT FROM NEW.{}) "
            "EXECUTE FUNCTION pgembed.capture_update_v1({}, {})"
        ).format(upd, text, table, text, text, args, sql.Literal(spec.embedding_column)),
        sql.SQL(
            "CREATE TRIGGER {} AFTER DELETE ON {} REFERENCING OLD TABLE AS pgembed_old "
            "FOR EACH STATEMENT EXECUTE FUNCTION pgembed.capture_delete_v1({})"
        ).format(dele, table, args),
        sql.SQL(
            "CREATE TRIGGER {} AFTER TRUNCATE ON {} "
            "FOR EACH STATEMENT EXECUTE FUNCTION pgembed.capture_truncate_v1({})"
        ).format(trunc, table, args),
    ]
    for statement in statements:
        conn.execute(statement)


def drop_triggers(conn: psycopg.Connection, spec: ModelSpec) -> None:
    table = naming.table(spec)
    for name in naming.trigger_names(spec):
        conn.execute(sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(name), table))


def enqueue_existing(conn: psycopg.Connection, spec: ModelSpec) -> int:
    """Queue every row that has text; returns how many were queued."""
    cur = conn.execute(
        sql.SQL(
            "INSERT INTO pgembed.queue (model, key) "
            "SELECT %s, {key}::text FROM {table} WHERE btrim({text}) <> '' "
            "ON CONFLICT (model, key) DO NOTHING"
        ).format(
            key=sql.Identifier(spec.key_column),
            table=naming.table(spec),
            text=sql.Identifier(spec.text_column),
        ),
        (spec.name,),
    )
    conn.execute("SELECT pg_notify(%s, %s)", (naming.CHANNEL, spec.name))
    return cur.rowcount
