"""Rows of a watched table, and of them embedded, for `pgembed status`: exact when the table is
small, else estimated from a sample of its pages (a count of a million rows took 0.8 s a call,
and `status --watch` repeats it). An estimate is marked as one; `status --exact` counts."""

from __future__ import annotations

import json
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgembed.catalog import naming, tables
from pgembed.catalog.registry import ModelSpec

# Tables up to this many rows are counted exactly: reading them takes a few milliseconds.
EXACT_UP_TO = 100_000
# A larger table's estimate reads about this many of its pages, the same ones each time; fewer
# rows than MIN_SAMPLE_ROWS there tell too little, and the table is counted.
SAMPLE_PAGES = 2_000
MIN_SAMPLE_ROWS = 500


@dataclass(frozen=True)
class Counts:
    total: int
    embedded: int
    exact: bool


def rows(conn: psycopg.Connection, spec: ModelSpec, exact: bool = False) -> Counts:
    """The model's rows with a text to embed, and of them those with a vector."""
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
    # the statistics system's live rows; the planner's estimate when it has none (after a crash)
    total = tables.live_rows(conn, spec.table_schema, spec.table_name) or planned_rows(conn, table)
    seen, with_text, embedded = _sample(conn, spec)
    if seen < MIN_SAMPLE_ROWS:  # pages left all but empty (a mass delete): counted instead
        return rows(conn, spec, exact=True)
    return Counts(round(total * with_text / seen), round(total * embedded / seen), False)


def _sample(conn: psycopg.Connection, spec: ModelSpec) -> tuple[int, int, int]:
    """Of a sample of the table's pages (TABLESAMPLE SYSTEM, whole pages, REPEATABLE: the same
    pages each time, so `status --watch` moves only as their rows do): its rows, those with a
    text, and of them those with a vector. Statistics told neither: a text column's NULLs are
    not counted in the live rows, and the vector column's share of NULLs at the last ANALYZE
    stayed as it was through a backfill of up to a tenth of the table (1,567 of ~1,000,000
    after 6,561 were embedded). A text's length is read from its header, not from TOAST; so a
    text of blanks counts as a text here."""
    has_text = sql.SQL(" OR ").join(
        sql.SQL("pg_catalog.octet_length(t.{}::pg_catalog.text) > 0").format(sql.Identifier(c))
        for c in spec.text_columns
    )
    # The percentage of the table's pages that is SAMPLE_PAGES of them (all of a small table).
    share = sql.SQL(
        "(SELECT LEAST(100, 100.0 * %(pages)s / GREATEST(1, pg_catalog.pg_relation_size("
        "%(table)s::pg_catalog.regclass) / pg_catalog.current_setting('block_size')::integer)))"
    )
    row = conn.execute(
        sql.SQL(
            "SELECT pg_catalog.count(*), pg_catalog.count(*) FILTER (WHERE s.has), "
            "pg_catalog.count(*) FILTER (WHERE s.has AND s.vector) FROM ("
            "SELECT coalesce({has}, false) AS has, t.{column} IS NOT NULL AS vector "
            "FROM ONLY {table} t TABLESAMPLE SYSTEM ({share}) REPEATABLE (0)) s"
        ).format(
            has=has_text,
            column=sql.Identifier(spec.embedding_column),
            table=naming.table(spec),
            share=share,
        ),
        {"pages": SAMPLE_PAGES, "table": naming.table(spec).as_string(conn)},
    ).fetchone()
    return (int(row[0]), int(row[1]), int(row[2])) if row else (0, 0, 0)


def chunks(conn: psycopg.Connection, spec: ModelSpec, exact: bool = False) -> tuple[int, bool]:
    """Rows of a chunked model's chunk table (exact when few), and whether that is exact."""
    table = naming.chunk_table(spec)
    if exact or _at_most(conn, table, EXACT_UP_TO):
        found = conn.execute(sql.SQL("SELECT pg_catalog.count(*) FROM {}").format(table))
        row = found.fetchone()
        return (int(row[0]) if row else 0), True
    live = tables.live_rows(conn, spec.table_schema, naming.chunk_table_name(spec))
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
