"""Rows of a watched table, and of them embedded, for `pgembed status`: exact when the table is
small, else estimated without scanning it (a count of a million rows took 0.8 s a call, and
`status --watch` repeats it). An estimate is marked as one; `status --exact` counts."""

from __future__ import annotations

import json
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgembed.catalog import naming, tables
from pgembed.catalog.registry import ModelSpec

# Tables up to this many rows are counted exactly: reading them takes a few milliseconds.
EXACT_UP_TO = 100_000
# An ANALYZE older than this share of the table's rows changed since is not trusted.
STALE_SHARE = 0.1


@dataclass(frozen=True)
class Counts:
    total: int
    embedded: int
    exact: bool


def rows(conn: psycopg.Connection, spec: ModelSpec, unembedded: int, exact: bool = False) -> Counts:
    """The model's rows and embedded rows. `unembedded`: the keys waiting (queued or failed),
    which an estimate subtracts from the rows when the column's statistics are stale."""
    table = naming.table(spec)
    if exact or _at_most(conn, table, EXACT_UP_TO):
        # The rows with a text to embed, as a reindex's progress counts them: a NULL or blank
        # text is never embedded, so counting it would leave "182/183" forever. Of them, those
        # with a vector: one on a row without text (loaded by the owner) made "315/312".
        counted = conn.execute(
            sql.SQL(
                "SELECT pg_catalog.count(*) FILTER (WHERE t.has), "
                "pg_catalog.count(*) FILTER (WHERE t.has AND t.vector) FROM ("
                "SELECT pgembed._has_text_v1(({text})::pg_catalog.text) AS has, "
                "{column} IS NOT NULL AS vector FROM {table}) t"
            ).format(
                text=naming.text_expression(spec),
                column=sql.Identifier(spec.embedding_column),
                table=table,
            )
        ).fetchone()
        return Counts(counted[0], counted[1], True) if counted else Counts(0, 0, True)
    found = tables.estimate(conn, spec.table_schema, spec.table_name, spec.embedding_column)
    # the statistics system's live rows; the planner's estimate when it has none (after a crash)
    total = found.live or planned_rows(conn, table)
    if found.null_frac is not None and found.changed <= STALE_SHARE * total:
        embedded = round(total * (1 - found.null_frac))
    else:  # a backfill since the last ANALYZE: the rows that wait are the ones without a vector
        embedded = total - unembedded
    return Counts(total, max(0, min(total, embedded)), False)


def chunks(conn: psycopg.Connection, spec: ModelSpec, exact: bool = False) -> tuple[int, bool]:
    """Rows of a chunked model's chunk table (exact when few), and whether that is exact."""
    table = naming.chunk_table(spec)
    if exact or _at_most(conn, table, EXACT_UP_TO):
        found = conn.execute(sql.SQL("SELECT pg_catalog.count(*) FROM {}").format(table))
        row = found.fetchone()
        return (int(row[0]) if row else 0), True
    live = tables.estimate(conn, spec.table_schema, naming.chunk_table_name(spec), "key").live
    return live or planned_rows(conn, table), False


def _at_most(conn: psycopg.Connection, table: sql.Composable, limit: int) -> bool:
    """Whether the table has at most `limit` rows; reads at most limit + 1 of them."""
    query = sql.SQL("SELECT pg_catalog.count(*) FROM (SELECT FROM {} LIMIT {}) r").format(
        table, sql.Literal(limit + 1)
    )
    row = conn.execute(query).fetchone()
    return row is not None and row[0] <= limit


def planned_rows(conn: psycopg.Connection, table: sql.Composable) -> int:
    """The planner's estimate of a table's rows: its last VACUUM/ANALYZE's density times its
    pages now (so a bulk load since is in it, and dead rows too). Reads no row."""
    query = sql.SQL("EXPLAIN (FORMAT JSON) SELECT FROM {}").format(table)
    row = conn.execute(query).fetchone()
    plan = row[0] if row else [{}]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])
