"""Top-k keys for many query vectors, by exact search (a full scan) or through the HNSW index.

Both keep the documented `ORDER BY column <=> q LIMIT k` form; planner settings, local to one
transaction, decide which path runs, so the two differ only in exactness.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import psycopg
from pgvector import Vector
from psycopg import sql

from pgembed import db
from pgembed.catalog import naming
from pgembed.catalog.registry import ModelSpec
from pgembed.encode.embedder import Vectors
from pgembed.search import plan


def _names(conn: psycopg.Connection, spec: ModelSpec) -> dict[str, sql.Composable]:
    """What both queries below name: the key, the table, the vector column, `<=>` qualified."""
    return {
        "key": sql.Identifier(spec.key_column),
        "table": naming.only(spec),
        "col": sql.Identifier(spec.embedding_column),
        "distance": db.distance_operator(conn),
    }


def _top_k(
    conn: psycopg.Connection, spec: ModelSpec, tie_break: bool, distance: bool = False
) -> sql.Composed:
    """Each row's key (and with `distance` its distance), nearest first."""
    names = _names(conn, spec)
    return sql.SQL(
        "SELECT t.{key}::text{distances} FROM {table} t WHERE t.{col} IS NOT NULL "
        "ORDER BY t.{col} {distance} %(q)s{tie} LIMIT %(k)s"
    ).format(
        **names,
        distances=sql.SQL(", t.{} {} %(q)s").format(names["col"], names["distance"])
        if distance
        else sql.SQL(""),
        tie=sql.SQL(", 1") if tie_break else sql.SQL(""),
    )


def _best_windows(conn: psycopg.Connection, spec: ModelSpec) -> sql.Composed:
    """A chunked model's exact top k: each row ranked by its best window, every window read."""
    return sql.SQL(
        "SELECT u.key FROM ("
        "SELECT t.{key}::text AS key, t.{col} {distance} %(q)s AS distance FROM {table} t "
        "WHERE t.{col} IS NOT NULL "
        "UNION ALL SELECT t.{key}::text, c.embedding {distance} %(q)s FROM {chunks} c "
        "JOIN {table} t ON {matches} WHERE t.{col} IS NOT NULL) u "
        "GROUP BY u.key ORDER BY pg_catalog.min(u.distance), u.key LIMIT %(k)s"
    ).format(
        **_names(conn, spec),
        chunks=naming.chunk_table(spec),
        matches=naming.key_is(spec, "t", naming.key_at(spec, "c", "key")),
    )


# A chunked model's indexed top k is pgembed.search's: two index scans merged (_semantic_v1).
_SEARCH = sql.SQL("SELECT s.key FROM pgembed.search(%(model)s, %(q)s, %(k)s) s")


def exact(conn: psycopg.Connection, spec: ModelSpec, vectors: Vectors, k: int) -> list[list[str]]:
    """The true k nearest rows of each vector (ties broken by key): a sequential scan."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_indexscan = off")
        conn.execute("SET LOCAL enable_bitmapscan = off")
        query = _best_windows(conn, spec) if spec.chunked else _top_k(conn, spec, tie_break=True)
        return _run(conn, query, vectors, k, spec.name)


def indexed(
    conn: psycopg.Connection, spec: ModelSpec, vectors: Vectors, k: int, ef_search: int | None
) -> list[list[str]]:
    """What the HNSW index returns at `ef_search` (None: the server's setting)."""
    with conn.transaction():
        _prefer_index(conn, ef_search)
        if spec.chunked:  # pgembed.search takes its ef_search from here, not hnsw.ef_search
            plan.set_ef_search(conn, effective_ef_search(conn, spec, ef_search))
            return _run(conn, _SEARCH, vectors, k, spec.name)
        return _run(conn, _top_k(conn, spec, tie_break=False), vectors, k)


def nearest(
    conn: psycopg.Connection, spec: ModelSpec, vectors: Vectors, k: int, ef_search: int
) -> list[tuple[list[str], float]]:
    """One walk of the (unchunked) model's HNSW index at `ef_search` per vector, as
    pgembed.search's first walk: its keys and its rows' mean cosine distance (2, the largest,
    when it found none)."""
    query = _top_k(conn, spec, tie_break=False, distance=True)
    walks = []
    with conn.transaction():
        _prefer_index(conn, ef_search)
        conn.execute("SET LOCAL hnsw.iterative_scan = off")
        with conn.cursor(binary=True) as cur:
            for v in vectors:
                rows = cur.execute(query, {"q": Vector(v), "k": k}).fetchall()
                mean = sum(float(r[1]) for r in rows) / len(rows) if rows else 2.0
                walks.append(([r[0] for r in rows], mean))
    return walks


def _prefer_index(conn: psycopg.Connection, ef_search: int | None) -> None:
    # On a small table the planner would rather scan; an index evaluation must use the index.
    conn.execute("SET LOCAL enable_seqscan = off")
    if ef_search is not None:
        conn.execute("SELECT pg_catalog.set_config('hnsw.ef_search', %s, true)", (str(ef_search),))


def _run(
    conn: psycopg.Connection,
    query: sql.SQL | sql.Composed,
    vectors: Vectors,
    k: int,
    model: str | None = None,
) -> list[list[str]]:
    with conn.cursor(binary=True) as cur:
        return [
            [row[0] for row in cur.execute(query, {"q": Vector(v), "k": k, "model": model})]
            for v in vectors
        ]


def effective_ef_search(conn: psycopg.Connection, spec: ModelSpec, ef_search: int | None) -> int:
    """The ef_search pgembed's search of the model runs with (no filter): `ef_search` (the
    model's), else the server's or session's own hnsw.ef_search, else pgembed's default for the
    table's size and how densely its graph was built (pgembed._graph_ef_v1 for an
    ef_construction below 200, else pgembed._default_ef_v1: pgvector's 40 on a small table)."""
    if ef_search is not None:
        return ef_search
    conn.execute("LOAD 'vector'")  # so that current_setting knows the parameter
    row = conn.execute(
        "SELECT pg_catalog.current_setting('hnsw.ef_search'), COALESCE("
        "pgembed._graph_ef_v1(t.r, %s), pgembed._default_ef_v1(("
        "SELECT CASE WHEN c.reltuples OPERATOR(pg_catalog.>=) 0::pg_catalog.float4 "
        "THEN c.reltuples END FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) t.r)))"
        " FROM (SELECT pg_catalog.to_regclass("
        "pg_catalog.format('%%I.%%I', %s::text, %s::text)) AS r) t",
        (spec.hnsw_ef_construction, spec.table_schema, spec.table_name),
    ).fetchone()
    if row is None:
        return 40
    own, default = row
    return int(own) if own != "40" else int(default)


def uses_index(conn: psycopg.Connection, spec: ModelSpec, vector: Vectors, k: int) -> bool:
    """Whether the indexed search's plan really goes through the model's HNSW index."""
    with conn.transaction():
        _prefer_index(conn, None)
        query = sql.SQL("EXPLAIN (FORMAT JSON) ") + _top_k(conn, spec, tie_break=False)
        row = conn.execute(query, {"q": Vector(vector), "k": k}).fetchone()
    return row is not None and f'"{naming.index_name(spec)}"' in json.dumps(row[0])


def count_keys(conn: psycopg.Connection, spec: ModelSpec, keys: Sequence[str]) -> int:
    """How many of `keys` are rows of the model's table."""
    row = conn.execute(
        sql.SQL(
            "SELECT pg_catalog.count(*) FROM {table} "
            "WHERE {key}::pg_catalog.text OPERATOR(pg_catalog.=) ANY(%s)"
        ).format(table=naming.only(spec), key=sql.Identifier(spec.key_column)),
        (list(keys),),
    ).fetchone()
    return int(row[0]) if row else 0
