"""Per-model database objects on the watched table: vector column, HNSW and full-text indexes
(the capture triggers are capture.py's).

Every user identifier goes through psycopg.sql.Identifier; every value is a bound parameter.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pgembed import capture, sqlfiles
from pgembed.catalog import naming
from pgembed.catalog.registry import ModelSpec

# The text search configuration of the full-text index; the SQL helpers in migrations/0002 use
# the same expression, to_tsvector('english', text), so the planner can match it to the index.
FULLTEXT_CONFIG = "english"


def create(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """Column, index and triggers; run inside the caller's transaction."""
    add_column(conn, spec)
    create_index(conn, spec)
    capture.create_triggers(conn, spec)


def add_column(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """The model's vector column, of its dimensions."""
    conn.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN {} vector({})").format(
            naming.table(spec), sql.Identifier(spec.embedding_column), sql.Literal(spec.dimensions)
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
            "CREATE INDEX {concurrently} {name} ON {table} USING hnsw ({column} vector_cosine_ops) "
            "WITH (m = {m}, ef_construction = {ef})"
        ).format(
            concurrently=sql.SQL("CONCURRENTLY" if concurrently else ""),
            name=sql.Identifier(name or naming.index_name(spec)),
            table=naming.table(spec),
            column=sql.Identifier(spec.embedding_column),
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
            "USING gin (to_tsvector({config}, {column}))"
        ).format(
            concurrently=sql.SQL("CONCURRENTLY" if concurrently else ""),
            name=sql.Identifier(naming.fulltext_index_name(spec)),
            table=naming.table(spec),
            config=sql.Literal(FULLTEXT_CONFIG),
            column=sql.Identifier(spec.text_column),
        )
    )


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


def drop(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """Remove the model's triggers, index and column; the table's other data is untouched."""
    table = naming.table(spec)
    capture.drop_triggers(conn, spec)
    for index in (naming.index_name(spec), naming.fulltext_index_name(spec)):
        conn.execute(
            sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(spec.table_schema, index))
        )
    conn.execute(
        sql.SQL("ALTER TABLE {} DROP COLUMN IF EXISTS {}").format(
            table, sql.Identifier(spec.embedding_column)
        )
    )
    for bookkeeping in ("queue", "inbox", "failures", "truncated", "batches"):
        conn.execute(
            sql.SQL("DELETE FROM pgembed.{} WHERE model = %s").format(sql.Identifier(bookkeeping)),
            (spec.name,),
        )
