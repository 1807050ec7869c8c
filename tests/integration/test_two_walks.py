"""Two walks (`pgembed tune`, search/walks.py) on the 324 embedded sample reviews: pgembed.search
walks a second time exactly when its first walk's 10 rows are at the recorded mean distance or
more, and only for 10 rows where pgembed chose the effort; tune records what it measured (its
share of queries walking twice is the search's); a new graph or version forgets them. The front
ends (`Client`, the CLI, `serve`, SQLAlchemy) search through pgembed.search: they walk alike."""

from __future__ import annotations

import json
from collections.abc import Sequence

import psycopg
from psycopg import sql

from helpers import cli
from pgembed import db
from pgembed.catalog import naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.embedder import Vectors
from pgembed.encode.settings import settings_of
from pgembed.search import topk, tune, walks

NEAR = "the acting was wooden and the plot made no sense at all"
FAR = "lattice quantum chromodynamics on a torus of prime order"


def scans(conn: psycopg.Connection, spec: ModelSpec) -> int:
    """Scans of the model's HNSW index in this transaction so far (the statistics' own count)."""
    index = sql.Identifier(spec.table_schema, naming.index_name(spec)).as_string(conn)
    row = conn.execute("SELECT pg_stat_get_xact_numscans(%s::regclass)", (index,)).fetchone()
    assert row is not None
    return int(row[0])


def walked(conn: psycopg.Connection, spec: ModelSpec, statement: str, *params: object) -> int:
    """How many walks of the index one search made, in a transaction of its own."""
    with conn.transaction():
        before = scans(conn, spec)
        rows = conn.execute(statement, params).fetchall()
        assert rows
        return scans(conn, spec) - before


def encode(spec: ModelSpec, texts: Sequence[str]) -> Vectors:
    return embedder.get(settings_of(spec)).encode_queries(list(texts))


def literal(vector: Sequence[float]) -> str:
    return str([float(x) for x in vector])


def vectors(spec: ModelSpec, *texts: str) -> list[str]:
    return [literal(v) for v in encode(spec, texts)]


def recorded(conn: psycopg.Connection) -> tuple[object, ...]:
    """The model's two walks as the catalog holds them: first, second, mean distance."""
    row = conn.execute(
        "SELECT first_walk_ef_search, second_walk_ef_search, second_walk_mean_distance "
        "FROM pgembed.models WHERE name = 'minilm'"
    ).fetchone()
    assert row is not None
    return tuple(row)


def server_ef_search(shop_url: str, value: int | None) -> None:
    """The database's own hnsw.ef_search (None: reset), as a DBA would set it."""
    with psycopg.connect(shop_url, autocommit=True) as conn:
        conn.execute("LOAD 'vector'")
        name = sql.Identifier(conn.info.dbname)
        setting = (
            sql.SQL("SET hnsw.ef_search = {}").format(sql.Literal(value))
            if value
            else sql.SQL("RESET hnsw.ef_search")
        )
        conn.execute(sql.SQL("ALTER DATABASE {} {}").format(name, setting))


def mean_distance(conn: psycopg.Connection, query: str) -> float:
    """Of the query's 10 nearest rows (a first walk on 324 rows finds them all)."""
    row = conn.execute(
        "SELECT avg(d) FROM (SELECT embedding_minilm <=> %s::vector AS d FROM reviews "
        "ORDER BY 1 LIMIT 10) t",
        (query,),
    ).fetchone()
    assert row is not None
    return float(row[0])


SEARCH = "SELECT * FROM pgembed.search('minilm', %s::vector, %s)"


def test_a_far_query_walks_twice_a_near_one_once(shop_url: str) -> None:
    with db.connection(shop_url) as conn:
        spec = registry.get(conn, "minilm")
        near, far = vectors(spec, NEAR, FAR)
        low, high = mean_distance(conn, near), mean_distance(conn, far)
        assert low < high
        # One walk until two are recorded.
        assert walked(conn, spec, SEARCH, far, 10) == 1
        conn.execute(
            "UPDATE pgembed.models SET first_walk_ef_search = 60, second_walk_ef_search = 1000, "
            "second_walk_mean_distance = %s WHERE name = 'minilm'",
            ((low + high) / 2,),
        )
        assert walked(conn, spec, SEARCH, near, 10) == 1
        assert walked(conn, spec, SEARCH, far, 10) == 2
        # The second walk's rows, nearest first: the raw statement's at ef_search 1000.
        with conn.transaction():
            conn.execute("SET LOCAL hnsw.ef_search = 1000")
            raw = conn.execute(
                "SELECT id::text, 1 - (embedding_minilm <=> %s::vector) FROM reviews "
                "ORDER BY embedding_minilm <=> %s::vector LIMIT 10",
                (far, far),
            ).fetchall()
        found = conn.execute(SEARCH, (far, 10)).fetchall()
        assert [r[0] for r in found] == [r[0] for r in raw]
        assert [r[1] for r in found] == sorted((r[1] for r in found), reverse=True)
        # The settings in force are put back, in the caller's transaction.
        settings = "SELECT current_setting('hnsw.ef_search'), " + ", ".join(
            f"current_setting('{name}')" for name in ("hnsw.iterative_scan", "enable_seqscan")
        )
        with conn.transaction():
            conn.execute("LOAD 'vector'")
            before = conn.execute(settings).fetchone()
            assert walked(conn, spec, SEARCH, far, 10) == 2
            assert conn.execute(settings).fetchone() == before == ("40", "off", "on")
        # Once for another k (tune measured 10), and where the caller chose the effort: its own
        # hnsw.ef_search, pgembed.ef_search.
        assert walked(conn, spec, SEARCH, far, 5) == 1
        assert walked(conn, spec, SEARCH, far, 11) == 1
        with conn.transaction():
            conn.execute("SET LOCAL hnsw.ef_search = 60")
            assert walked(conn, spec, SEARCH, far, 10) == 1
        with conn.transaction():
            conn.execute("SET LOCAL pgembed.ef_search = 60")
            assert walked(conn, spec, SEARCH, far, 10) == 1
        # Nor through the dynamic path (a filter): 324 matching rows are read exactly (no walk).
        filtered = (
            "SELECT * FROM pgembed.search('minilm', %s::vector, %s, '{\"id\": {\"$gt\": 0}}')"
        )
        assert walked(conn, spec, filtered, far, 10) == 0
        # A first walk of 40, hnsw.ef_search's value already: the second walk sets it and puts
        # it back all the same.
        conn.execute("UPDATE pgembed.models SET first_walk_ef_search = 40 WHERE name = 'minilm'")
        with conn.transaction():
            assert walked(conn, spec, SEARCH, near, 10) == 1
            assert walked(conn, spec, SEARCH, far, 10) == 2
            assert conn.execute(settings).fetchone() == before


def test_a_new_graph_or_version_forgets_the_two_walks(shop_url: str) -> None:
    two = (
        "UPDATE pgembed.models SET first_walk_ef_search = 40, second_walk_ef_search = 1000, "
        "second_walk_mean_distance = 0.5 WHERE name = 'minilm'"
    )
    for command in (["--index-only", "--ef-construction", "64"], []):
        with db.connection(shop_url) as conn:
            conn.execute(two)
        result = cli("--database-url", shop_url, "reindex", "minilm", *command)
        assert result.exit_code == 0, result.output
        with db.connection(shop_url) as conn:
            assert recorded(conn) == (None, None, None)


def test_tune_records_two_walks_that_search_follows(shop_url: str) -> None:
    # A wider default walk (200, the floor), so that a first walk of 40 is worth measuring.
    server_ef_search(shop_url, 200)
    result = cli("--database-url", shop_url, "tune", "minilm", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    pair = report["two_walks"]
    assert report["ef_search"] == 200 and pair is not None
    assert pair["first"] == 40 and pair["second"] in (200, 1000)
    assert pair["lower"] >= report["target"] and pair["recall"] >= report["default_recall"]
    assert pair["twice"] <= walks.MOST_TWICE and pair["effort"] < 200
    server_ef_search(shop_url, None)
    with db.connection(shop_url) as conn:
        spec = registry.get(conn, "minilm")
        assert recorded(conn)[:2] == (40, pair["second"])
        assert recorded(conn)[2] == pair["distance"]
        # tune's queries, searched: the ones whose first walk's rows are at the mean distance
        # or more walk twice, the others once, in the share tune measured.
        texts = tune.excerpts(conn, spec, 200)  # tune's, at its default --sample
        assert len(texts) == report["sample"]
        encoded = encode(spec, texts)
        firsts = topk.nearest(conn, spec, encoded, 10, 40)
        counts = [walked(conn, spec, SEARCH, literal(v), 10) for v in encoded]
    expected = [2 if d >= pair["distance"] else 1 for _, d in firsts]
    assert counts == expected
    assert sum(c == 2 for c in counts) / len(counts) == pair["twice"]
    # --one-walk records one walk, and forgets the two.
    result = cli("--database-url", shop_url, "tune", "minilm", "--one-walk", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["two_walks"] is None
    with db.connection(shop_url) as conn:
        assert recorded(conn)[0] is None


def test_the_text_output_names_the_two_walks(shop_url: str) -> None:
    server_ef_search(shop_url, 200)
    result = cli("--database-url", shop_url, "tune", "minilm", "--sample", "60")
    assert result.exit_code == 0, result.output
    assert "model minilm: ef_search 200 recorded" in result.output
    assert "and two walks for unfiltered searches of 10 rows: ef_search 40, then" in result.output


def test_two_walks_below_the_floor_are_named_not_recorded(shop_url: str) -> None:
    with db.connection(shop_url) as conn:
        spec = registry.get(conn, "minilm")
        texts = tune.excerpts(conn, spec, 60)
        encoded = encode(spec, texts)
        exact = topk.exact(conn, spec, encoded, 10)
        # A floor no walk reaches (the untuned recall, were it above 1): none kept, and the ones
        # the target alone allows named, for --allow-below-default.
        kept, below = walks.measure(conn, spec, encoded, exact, 200, 0.5, 1.01)
        assert kept is None and below is not None and below.first == 40
        assert walks.measure(conn, spec, encoded, exact, 200, 0.5, 0.0) == (below, None)
