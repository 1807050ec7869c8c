"""pgembed.search takes the faster path: the HNSW index on a table of long-text rows where the
planner, left alone, scans every row; an exact scan on a tiny table, with exact answers."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest
from pgvector import Vector
from psycopg import sql

from helpers import database, database_name, hnsw_built_after, plans, writing_vectors
from pgembed import db
from pgembed.catalog import registry
from pgembed.lifecycle import models
from pgembed.search import topk

LONG_ROWS, TINY_ROWS = 2000, 150
HNSW = "Index Scan using pgembed_{}_hnsw"


def texts(n: int) -> list[str]:
    """600-character texts pglz cannot shrink (hex digests), so each row's vector goes to TOAST."""
    return [
        "".join(hashlib.sha256(f"{i}.{j}".encode()).hexdigest() for j in range(10))[:600]
        for i in range(n)
    ]


def unit_vectors(n: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(n, 384)).astype(np.float32)
    unit: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return unit


def make_table(conn: psycopg.Connection, name: str, rows: int) -> None:
    """Table `name` (id, body) of long texts, model `name`, random unit vectors written directly."""
    conn.execute(
        sql.SQL("CREATE TABLE {} (id integer PRIMARY KEY, body text)").format(sql.Identifier(name))
    )
    models.add(conn, models.AddRequest(name, name, "body", precision="fp32"))
    copy = sql.SQL("COPY {} (id, body, {}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(name), sql.Identifier(f"embedding_{name}")
    )
    loading = hnsw_built_after(conn, name)
    with loading, writing_vectors(conn), conn.cursor() as cur, cur.copy(copy) as out:
        out.set_types(["integer", "text", "vector"])
        for i, (text, vector) in enumerate(zip(texts(rows), unit_vectors(rows, rows), strict=True)):
            out.write_row((i, text, Vector(vector)))
    conn.execute("DELETE FROM pgembed.inbox")  # the vectors are already there
    conn.execute("DELETE FROM pgembed.queue")
    conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def tables_url(server_url: str, template_url: str) -> Iterator[str]:
    """`long` (2,000 rows) and `tiny` (150 rows), both of 600-character texts."""
    with database(server_url, "pgembed_test_paths", template=database_name(template_url)) as url:
        with db.connection(url) as conn:
            make_table(conn, "long", LONG_ROWS)
            make_table(conn, "tiny", TINY_ROWS)
        yield url


@pytest.fixture
def paths(tables_url: str) -> Iterator[psycopg.Connection]:
    with db.connection(tables_url) as conn:
        conn.autocommit = True
        yield conn


def searches(found: list[str], name: str) -> list[str]:
    """The plans of pgembed's own nearest-row statements (written with OPERATOR(...))."""
    return [p for p in found if f"embedding_{name} OPERATOR(" in p]


def query(seed: int = 1) -> Vector:
    return Vector(unit_vectors(1, 1000 + seed)[0])


def exact(conn: psycopg.Connection, name: str, q: Vector, k: int) -> list[str]:
    with conn.transaction():
        conn.execute("SET LOCAL enable_indexscan = off")
        statement = sql.SQL("SELECT id::text FROM {} ORDER BY {} <=> %s LIMIT %s").format(
            sql.Identifier(name), sql.Identifier(f"embedding_{name}")
        )
        return [key for (key,) in conn.execute(statement, (q, k))]


def test_the_premise_vectors_in_toast_and_the_planner_scans(paths: psycopg.Connection) -> None:
    heap = paths.execute("SELECT pg_relation_size('long')").fetchone()
    assert heap is not None and heap[0] < LONG_ROWS * 1544  # a vector alone takes 1,544 bytes
    plan = paths.execute(
        "EXPLAIN SELECT id FROM long ORDER BY embedding_long <=> %s LIMIT 10", (query(),)
    ).fetchall()
    assert "Seq Scan on long" in "\n".join(line for (line,) in plan)


def test_search_uses_the_index_on_long_rows(paths: psycopg.Connection) -> None:
    with plans(paths) as found:
        for k in (10, 100, 101):  # LIMIT 10, LIMIT 100, and the dynamic path
            keys = paths.execute("SELECT key FROM pgembed.search('long', %s, %s)", (query(), k))
            assert len(keys.fetchall()) == k
        similar = paths.execute("SELECT key FROM pgembed.similar('long', '5', 10)").fetchall()
    assert len(similar) == 10 and ("5",) not in similar
    scans = searches(found, "long")
    assert len(scans) == 4
    assert all(HNSW.format("long") in p and "Seq Scan" not in p for p in scans)


def test_search_of_a_tiny_table_is_exact(paths: psycopg.Connection) -> None:
    for seed in range(5):
        q = query(seed)
        for k in (10, 101):  # the compiled path and the dynamic one
            with plans(paths) as found:
                keys = paths.execute("SELECT key FROM pgembed.search('tiny', %s, %s)", (q, k))
                hits = [key for (key,) in keys]
            assert hits == exact(paths, "tiny", q, k)
            scans = searches(found, "tiny")
            assert len(scans) == 1 and "Seq Scan on tiny" in scans[0]
            assert "Index Scan" not in scans[0]


def test_settings_are_the_callers_again(paths: psycopg.Connection) -> None:
    def settings() -> tuple[str, str]:
        row = paths.execute(
            "SELECT current_setting('enable_seqscan'), current_setting('enable_indexscan')"
        ).fetchone()
        assert row is not None
        return row

    for name in ("long", "tiny"):
        for k in (10, 101):
            paths.execute("SELECT * FROM pgembed.search(%s, %s, %s)", (name, query(), k))
            assert settings() == ("on", "on")
    with paths.transaction():
        paths.execute("SET LOCAL enable_seqscan = off")
        paths.execute("SELECT * FROM pgembed.search('long', %s, 101)", (query(),))
        paths.execute("SELECT * FROM pgembed.search('tiny', %s, 101)", (query(),))
        assert settings() == ("off", "on")


def test_a_filter_still_leaves_the_choice_to_the_planner(paths: psycopg.Connection) -> None:
    # 20 of 2,000 rows match: sorting them beats walking the index past 1,980 others.
    selective = '{"id": {"$lt": 20}}'
    with plans(paths) as found:
        keys = paths.execute(
            "SELECT key FROM pgembed.search('long', %s, 10, %s)", (query(), selective)
        ).fetchall()
    assert all(int(key) < 20 for (key,) in keys) and len(keys) == 10
    assert not any(HNSW.format("long") in p for p in found)


def one(conn: psycopg.Connection, statement: str, params: tuple[object, ...] = ()) -> object:
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    return row[0]


def test_the_default_effort_follows_how_densely_the_graph_was_built(
    paths: psycopg.Connection,
) -> None:
    """A graph built with ef_construction 200 (a new model's) gets _default_ef_v1's effort; one
    built sparser (pgvector's 64, older models') the faster-growing _graph_ef_v1, in the compiled
    search, the dynamic path's choice and the Python side alike."""
    growth = paths.execute(
        "SELECT pgembed._default_ef_v1(1e4), pgembed._default_ef_v1(1e5), "
        "pgembed._default_ef_v1(1e6), pgembed._default_ef_v1(1e8)"
    ).fetchone()
    assert growth == (80, 208, 541, 1000)  # the values docs/search.md gives
    source = "SELECT prosrc FROM pg_proc WHERE oid = 'pgembed.search'::regproc"
    spec = registry.get(paths, "long")
    assert spec.hnsw_ef_construction == 200
    dense = topk.effective_ef_search(paths, spec, None)
    assert dense == one(paths, "SELECT pgembed._default_ef_v1(2000)") == 41
    assert one(paths, "SELECT pgembed._graph_ef_v1('long', 200)") is None
    assert "_graph_ef_v1" not in str(one(paths, source))

    paths.execute("UPDATE pgembed.models SET hnsw_ef_construction = 64 WHERE name = 'long'")
    try:
        sparse = topk.effective_ef_search(paths, registry.get(paths, "long"), None)
        assert sparse == one(paths, "SELECT pgembed._graph_ef_v1('long', 64)")
        assert sparse == 40  # 2,000 rows: pgvector's 40, where the denser graph gets 43
        # The compiler's trigger reran (at the autocommit's commit): the generated search asks.
        assert "pgembed._graph_ef_v1('public.long', 64)" in str(one(paths, source))
        paths.execute("SET pgembed.exact_rows = 0")  # a filter's search walks the index
        model = one(paths, "SELECT m FROM pgembed.models m WHERE m.name = 'long'")
        effort = one(
            paths,
            'SELECT pgembed._path_v1(%s, \'{"id": {"$gte": 0}}\', 10, '
            "pgembed._settings_v1('long'))",
            (model,),
        )
        assert effort == 40  # matches every row: the sparser graph's default, undivided
    finally:
        paths.execute("RESET pgembed.exact_rows")
        paths.execute("UPDATE pgembed.models SET hnsw_ef_construction = 200 WHERE name = 'long'")


def test_the_graph_as_built_is_read_from_the_index(paths: psycopg.Connection) -> None:
    """A chunked model's windows are walked in a graph `reindex --index-only` does not rebuild:
    its effort follows the sparsest HNSW index as built (its reloption; pgvector's 64 unset)."""
    paths.execute("CREATE TABLE graphs (id integer PRIMARY KEY, v vector(3))")
    try:
        built = "SELECT pgembed._built_ef_construction_v1('graphs')"
        assert one(paths, built) is None  # no HNSW index
        paths.execute(
            "CREATE INDEX graphs_dense ON graphs USING hnsw (v vector_cosine_ops) "
            "WITH (ef_construction = 200)"
        )
        assert one(paths, built) == 200
        paths.execute("CREATE INDEX graphs_plain ON graphs USING hnsw (v vector_l2_ops)")
        assert one(paths, built) == 64  # pgvector's default
        paths.execute("ALTER INDEX graphs_plain SET (ef_construction = 32)")
        assert one(paths, built) == 32
    finally:
        paths.execute("DROP TABLE graphs")
