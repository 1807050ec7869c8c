"""The right rows, best first, under any filter: the SQL helpers against an exact scan of the same
rows, on 2,500 real IMDb reviews' vectors made by the real model (tests/data/imdb-vectors.npz)
and 30 held-out reviews as queries.

`reviews` (id, rating 1-10, cat 0-999, body, sentiment 'pos'/'neg'): `rating >= 8` matches 30 %
of the rows and has no index; `cat` has a B-tree index, `cat < 10` matches 1 %, `cat = 7` 0.1 %
(2 rows, fewer than k).
`SET pgembed.exact_rows = 0` makes every filtered search walk the HNSW index (with a relaxed-order
iterative scan) instead of reading the few matching rows exactly, as it does at this size.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector import Vector
from psycopg import sql
from psycopg.types.json import Jsonb
from roles_helpers import role_maker

from helpers import cli, database, database_name, plans
from pgembed import db, roles
from pgembed.catalog import ddl
from pgembed.errors import UsageError
from pgembed.lifecycle import models
from pgembed.search import planner

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests/data/imdb-vectors.npz"
K = 10
FILTERS: dict[str, tuple[dict[str, Any], str]] = {
    "30 %, no index": ({"rating": {"$gte": 8}}, "rating >= 8"),
    "1 %": ({"cat": {"$lt": 10}}, "cat < 10"),
    "0.1 %, fewer than k": ({"cat": 7}, "cat = 7"),
}


def _unit(stored: np.ndarray) -> np.ndarray:
    vectors = stored.astype(np.float32)
    unit: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return unit


@pytest.fixture(scope="module")
def real_url(server_url: str, template_url: str) -> Iterator[str]:
    """The 2,500 reviews' vectors in `reviews`, model `minilm`, its HNSW index, ANALYZEd."""
    documents = _unit(np.load(DATA)["documents"])
    with database(server_url, "pgembed_test_real", template=database_name(template_url)) as url:
        with db.connection(url) as conn:
            conn.execute(
                "CREATE TABLE reviews (id integer PRIMARY KEY, rating integer NOT NULL, "
                "cat integer NOT NULL, body text NOT NULL, "
                "sentiment text GENERATED ALWAYS AS (CASE WHEN rating >= 7 THEN 'pos' "
                "ELSE 'neg' END) STORED)"
            )
            request = models.AddRequest("minilm", "reviews", "body", precision="fp32", index=False)
            spec = models.add(conn, request)[0]
            # The vectors are there already: the capture triggers would queue every row.
            conn.execute("ALTER TABLE reviews DISABLE TRIGGER USER")
            copy = (
                "COPY reviews (id, rating, cat, body, embedding_minilm) FROM STDIN (FORMAT BINARY)"
            )
            with conn.cursor() as cur, cur.copy(copy) as out:
                out.set_types(["integer", "integer", "integer", "text", "vector"])
                for i, vector in enumerate(documents):
                    cat = i * 7919 % 1000
                    out.write_row((i, cat % 10 + 1, cat, f"review {i}", Vector(vector)))
            conn.execute("ALTER TABLE reviews ENABLE TRIGGER USER")
            conn.execute("CREATE INDEX reviews_cat ON reviews (cat)")
            ddl.create_index(conn, spec)
            ddl.create_fulltext_index(conn, spec)
            conn.execute("ANALYZE reviews")
        yield url


@pytest.fixture
def real(real_url: str) -> Iterator[psycopg.Connection]:
    with db.connection(real_url) as conn:
        yield conn


@pytest.fixture(scope="module")
def queries() -> list[Vector]:
    return [Vector(v) for v in _unit(np.load(DATA)["queries"])]


def exact(conn: psycopg.Connection, q: Vector, where: str = "true", k: int = K) -> list[int]:
    """The true k nearest matching rows: every row read (no index can order them)."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_indexscan = off")
        found = conn.execute(
            f"SELECT id FROM reviews WHERE {where} "  # where: a constant of this module
            "ORDER BY embedding_minilm <=> %s, id LIMIT %s",
            (q, k),
        ).fetchall()
    return [row[0] for row in found]


def search(
    conn: psycopg.Connection, q: Vector, filter: dict[str, Any] | None, k: int = K
) -> list[tuple[int, float]]:
    found = conn.execute(
        "SELECT key::integer, similarity FROM pgembed.search('minilm', %s, %s, %s)",
        (q, k, Jsonb(filter) if filter is not None else None),
    ).fetchall()
    return [(key, value) for key, value in found]


def recall(found: list[int], best: list[int]) -> float:
    return len(set(found) & set(best)) / len(best) if best else float(not found)


def best_first(values: list[float]) -> bool:
    return values == sorted(values, reverse=True)


# --- 1. best first, on every path ----------------------------------------------------------------


@pytest.mark.parametrize("walk", ["index walk", "default"])
def test_every_helper_returns_its_hits_best_first_under_a_filter(
    real: psycopg.Connection, queries: list[Vector], walk: str
) -> None:
    """A relaxed-order index scan returns near-ties out of order; the planner took its rows for
    sorted and skipped the helpers' sort: 4 of 50 queries came back unsorted on 10k reviews."""
    if walk == "index walk":
        real.execute("SET pgembed.exact_rows = 0")
    unsorted = []
    for n, q in enumerate(queries):
        for filter in ({"rating": {"$gte": 8}}, {"cat": {"$gte": 100}}):
            hits = search(real, q, filter, k=20)
            if not best_first([value for _, value in hits]):
                unsorted.append(("search", n, filter))
            similar = real.execute(
                "SELECT similarity FROM pgembed.similar('minilm', %s, 20, %s)",
                (str(n), Jsonb(filter)),
            ).fetchall()
            if not best_first([value for (value,) in similar]):
                unsorted.append(("similar", n, filter))
            # No row has the word, so the fused ranking is the vector ranking alone.
            hybrid = real.execute(
                "SELECT h.key, r.embedding_minilm <=> %s FROM pgembed.hybrid_search("
                "'minilm', %s, 'zyzzyva', 20, %s) WITH ORDINALITY AS h(key, score, n) "
                "JOIN reviews r ON r.id = h.key::integer ORDER BY h.n",
                (q, q, Jsonb(filter)),
            ).fetchall()
            if not best_first([-distance for _, distance in hybrid]):
                unsorted.append(("hybrid_search", n, filter))
    assert unsorted == []


# --- 2, 3. recall against an exact scan, with min(k, matching) hits ---------------------------


def test_recall_without_a_filter_by_default(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    recalls = [recall([key for key, _ in search(real, q, None)], exact(real, q)) for q in queries]
    assert np.mean(recalls) >= 0.95, recalls


@pytest.mark.parametrize("label", FILTERS)
@pytest.mark.parametrize("walk", ["default", "index walk"])
def test_recall_under_a_filter(
    real: psycopg.Connection, queries: list[Vector], label: str, walk: str
) -> None:
    """By default these few rows are read exactly; walking the index instead (its ef_search grown
    as the filter's share of the rows shrinks) still finds them."""
    filter, where = FILTERS[label]
    if walk == "index walk":
        real.execute("SET pgembed.exact_rows = 0")
    recalls, counts = [], []
    for q in queries:
        best = exact(real, q, where)
        found = search(real, q, filter)
        assert len(found) == min(K, len(best))
        assert best_first([value for _, value in found])
        recalls.append(recall([key for key, _ in found], best))
        counts.append(len(best))
    assert np.mean(recalls) >= 0.95, recalls
    if label.startswith("0.1"):
        assert set(counts) == {2}  # k > matching: every matching row, and no other


def test_a_filter_matching_every_row_or_none(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    for q in queries[:10]:
        everything = search(real, q, {"cat": {"$gte": 0}})
        assert recall([key for key, _ in everything], exact(real, q)) >= 0.9
        assert len(everything) == K
    assert search(real, queries[0], {"cat": 5000}) == []
    assert search(real, queries[0], {"cat": {"$in": []}}) == []


def test_k_larger_than_the_matching_rows(real: psycopg.Connection, queries: list[Vector]) -> None:
    found = search(real, queries[0], {"cat": {"$lt": 10}}, k=1000)
    assert [key for key, _ in found] == exact(real, queries[0], "cat < 10", k=1000)
    assert len(found) == 27


def test_an_index_walk_that_stops_short_is_made_up_by_an_exact_scan(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    """The planner expects enough rows for the index, but the walk ends (here pgvector's
    hnsw.max_scan_tuples, else stale statistics) with fewer than k: the matching rows are read
    exactly instead. k rows whenever k rows match."""
    with real.transaction():
        real.execute("SET LOCAL pgembed.exact_rows = 0")
        real.execute("SET LOCAL hnsw.max_scan_tuples = 100")
        for q in queries[:5]:
            found = search(real, q, {"cat": {"$lt": 12}}, k=20)
            assert [key for key, _ in found] == exact(real, q, "cat < 12", k=20)


def test_rows_the_first_walk_cannot_return_are_made_up_by_a_strict_order_scan(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    """Without a filter, pgembed.search walks the index once (ef_search candidates); when rows
    it may not return (deleted and not yet vacuumed, hidden by row-level security) leave fewer
    than k, a strict-order iterative scan reads on. k rows, best first."""
    q = queries[0]
    nearest = exact(real, q, k=45)
    with real.transaction(force_rollback=True):
        # Deleted in this transaction: still in the index, not visible to it.
        real.execute("DELETE FROM reviews WHERE id = ANY(%s)", (nearest[:35],))
        with real.transaction(force_rollback=True):
            real.execute("SET LOCAL hnsw.ef_search = 40")
            real.execute("SET LOCAL hnsw.iterative_scan = off")
            real.execute("SET LOCAL enable_seqscan = off")
            one_walk = real.execute(
                "SELECT id FROM reviews ORDER BY embedding_minilm <=> %s LIMIT 10", (q,)
            ).fetchall()
        assert 0 < len(one_walk) < 10  # the case at hand: some rows, not k
        real.execute("SET LOCAL pgembed.ef_search = 40")
        found = search(real, q, None, k=10)
    assert best_first([value for _, value in found])
    assert len(found) == 10 and recall([key for key, _ in found], nearest[35:]) >= 0.9


def index_scans(conn: psycopg.Connection) -> int:
    """The index scans on `reviews` of this transaction, so far."""
    row = conn.execute(
        "SELECT idx_scan FROM pg_stat_xact_user_tables WHERE relid = 'reviews'::regclass"
    ).fetchone()
    return int(row[0]) if row else 0


def test_the_callers_settings_are_put_back_on_either_path(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    """The index path sets ef_search, the iterative scan and enable_seqscan for its statements:
    the caller's values are back after the call, whether one walk sufficed (one index scan) or
    the strict scan followed it (a second)."""
    settings = ("hnsw.ef_search", "hnsw.iterative_scan", "enable_seqscan")

    def shown() -> list[str]:
        return [real.execute(f"SHOW {name}").fetchone()[0] for name in settings]  # type: ignore[index]

    q = queries[0]
    nearest = exact(real, q, k=75)
    with real.transaction(force_rollback=True):
        real.execute("SET LOCAL hnsw.ef_search = 77")
        real.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        real.execute("SET LOCAL enable_seqscan = on")
        before, scans = shown(), index_scans(real)
        assert len(search(real, q, None)) == 10
        assert (shown(), index_scans(real)) == (before, scans + 1)  # one walk sufficed
        real.execute("DELETE FROM reviews WHERE id = ANY(%s)", (nearest,))
        scans = index_scans(real)
        assert len(search(real, q, None)) == 10
        assert (shown(), index_scans(real)) == (before, scans + 2)  # it came short: the strict scan


@contextmanager
def as_tenant(conn: psycopg.Connection, url: str, rows: str) -> Iterator[None]:
    """In a transaction rolled back after: `reviews` under a policy that shows a new reader role
    only `rows` (an SQL condition), and the session as that role."""
    roles.create(conn)
    with role_maker(url) as make, conn.transaction(force_rollback=True):
        tenant = make("tenant", f"IN ROLE {roles.READER}")
        conn.execute(sql.SQL("GRANT SELECT ON reviews TO {}").format(sql.Identifier(tenant)))
        conn.execute("ALTER TABLE reviews ENABLE ROW LEVEL SECURITY")
        conn.execute(f"CREATE POLICY few ON reviews USING ({rows})")  # rows: this module's
        conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(tenant)))
        yield
        conn.execute("RESET ROLE")


def test_a_tenant_that_sees_few_rows_gets_k_of_them_best_first(
    real: psycopg.Connection, real_url: str, queries: list[Vector]
) -> None:
    """Under row-level security a tenant who sees 1 % of the rows searches without a filter:
    pgembed.search skips its single walk there (it would nearly always come short) and returns
    k of the tenant's rows, nearest first, as an exact search of them does."""
    with as_tenant(real, real_url, "cat < 10"):
        assert real.execute("SELECT row_security_active('reviews')").fetchone() == (True,)
        found = search(real, queries[0], None)
    assert best_first([value for _, value in found])
    best = exact(real, queries[0], "cat < 10")
    assert len(found) == 10 and recall([key for key, _ in found], best) >= 0.9


@pytest.mark.parametrize("walk", ["default", "index walk"])
def test_a_tenants_recall_is_that_of_the_same_filter(
    real: psycopg.Connection, real_url: str, queries: list[Vector], walk: str
) -> None:
    """Row-level security is a filter the tenant did not write: a search without a filter is
    sized by the rows the policy shows (the planner's estimate), as the same filter's would be:
    read exactly when few, else a walk whose effort grows as the share shrinks. Sized for the
    whole table, the walk met mostly hidden rows: on the bench's 1M rows, a policy showing 10 %
    got 0.944 of the visible top 10 (0.974 now). Here 10 % of 2,500 real reviews' vectors, with
    the index walked too (pgembed.exact_rows = 0), and an ef_search of 10 recorded for the
    model (as `pgembed tune` records one for the whole table): 0.943 before, 1.0 now."""
    shown = "cat < 100"
    real.execute("UPDATE pgembed.models SET ef_search = 10 WHERE name = 'minilm'")
    try:
        with as_tenant(real, real_url, shown):
            if walk == "index walk":
                real.execute("SET LOCAL pgembed.exact_rows = 0")
            recalls = []
            for q in queries:
                found = search(real, q, None)
                assert len(found) == K and best_first([value for _, value in found])
                recalls.append(recall([key for key, _ in found], exact(real, q, shown)))
    finally:
        real.execute("UPDATE pgembed.models SET ef_search = NULL WHERE name = 'minilm'")
    assert np.mean(recalls) >= 0.95, recalls


def test_a_walk_that_stops_short_without_a_filter_is_made_up_by_an_exact_scan(
    real: psycopg.Connection, real_url: str, queries: list[Vector]
) -> None:
    """Without a filter too, a search the index cannot fill gives k rows whenever k rows may be
    read: the strict scan stops at hnsw.max_scan_tuples (20,000 by default, 1 here with a narrow
    walk, so that 2,500 rows are enough), which it reaches before k rows when k is large or when
    row-level security hides most rows (a tenant who sees 1 % of them, by a policy no B-tree
    index serves). The rows are read exactly instead, on the generated path (k <= 100), the
    dynamic one (k > 100) and `similar`."""
    q, tenant_rows = queries[0], "mod(id, 100) = 7"
    with real.transaction(force_rollback=True):
        real.execute("SET LOCAL hnsw.max_scan_tuples = 1")
        real.execute("SET LOCAL pgembed.ef_search = 20")
        assert [key for key, _ in search(real, q, None, k=1000)] == exact(real, q, k=1000)
    with as_tenant(real, real_url, tenant_rows):
        real.execute("SET LOCAL hnsw.max_scan_tuples = 1")
        real.execute("SET LOCAL pgembed.ef_search = 20")
        found = {k: search(real, q, None, k=k) for k in (20, 1000)}
        first = found[20][0][0]
        similar = real.execute(
            "SELECT key::integer FROM pgembed.similar('minilm', %s, 20)", (str(first),)
        ).fetchall()
        # hybrid_search's vector ranking alone (no row has the words): the same rows.
        hybrid = real.execute(
            "SELECT key::integer FROM pgembed.hybrid_search('minilm', %s, 'zyzzyva', 20)", (q,)
        ).fetchall()
        # Sequential scans were turned off around the dynamic path's walk, and back on after.
        assert real.execute("SHOW enable_seqscan").fetchone() == ("on",)
    for k, hits in found.items():
        assert [key for key, _ in hits] == exact(real, q, tenant_rows, k=k), k
    assert len(found[1000]) == 25
    assert [key for (key,) in hybrid] == [key for key, _ in found[20]]
    (own,) = real.execute("SELECT embedding_minilm FROM reviews WHERE id = %s", (first,))
    nearest = exact(real, own[0], tenant_rows, k=21)
    assert [key for (key,) in similar] == [key for key in nearest if key != first]


def test_a_table_with_fewer_vectors_than_k_is_not_read_again(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    """30 rows of 2,500 have a vector (say, the others have no text): a search for 50 gives those
    30 from the index, and, as the statistics count no more, no exact read of the table follows
    at every search (a review found that on 1M rows of which 30 had a text)."""
    q = queries[0]
    with real.transaction(force_rollback=True):
        real.execute("SET LOCAL pgembed.writing = on")  # as if never embedded, not queued
        real.execute("UPDATE reviews SET embedding_minilm = NULL WHERE id >= 30")
        real.execute("ANALYZE reviews")
        scans = "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = 'reviews'::regclass"
        found = {}
        for k in (50, 200):  # the generated path, the dynamic one
            before = real.execute(scans).fetchone()
            found[k] = [key for key, _ in search(real, q, None, k=k)]
            assert real.execute(scans).fetchone() == before, k
        for k, keys in found.items():  # exact() turns index scans off for the transaction
            assert keys == exact(real, q, "id < 30", k=k), k


def test_statistics_taken_before_the_backfill_do_not_cut_a_large_k_short(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    """ANALYZE while the vector column was empty (autovacuum, before a backfill) says no row has a
    vector; a walk that stops at hnsw.max_scan_tuples must still be made up by an exact read (an
    audit's k = 25,000 gave 20,248 rows of 25,000). Small limits here: 2,500 rows suffice."""
    q = queries[0]
    with real.transaction(force_rollback=True):
        real.execute("SET LOCAL pgembed.writing = on")  # as the worker writes them
        real.execute("CREATE TEMP TABLE saved AS SELECT id, embedding_minilm FROM reviews")
        real.execute("UPDATE reviews SET embedding_minilm = NULL")
        real.execute("ANALYZE reviews")  # null_frac 1
        real.execute(
            "UPDATE reviews r SET embedding_minilm = s.embedding_minilm "
            "FROM saved s WHERE s.id = r.id"
        )
        real.execute("SET LOCAL hnsw.max_scan_tuples = 1")  # as the test above
        real.execute("SET LOCAL pgembed.ef_search = 20")
        found = [key for key, _ in search(real, q, None, k=1000)]
        assert found == exact(real, q, k=1000)  # exact() turns index scans off: last


# --- 4. plain SQL: docs/search.md's recipe ------------------------------------------------------


def _recipe() -> str:
    """The filtered plain-SQL recipe as docs/search.md shows it."""
    text = (ROOT / "docs/search.md").read_text()
    found = re.search(r"<!-- recipe: filtered -->\n```sql\n(.*?)```", text, re.DOTALL)
    assert found, "docs/search.md lost its filtered recipe"
    return found.group(1)


def test_the_plain_sql_recipe_returns_k_rows_best_first(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    recipe = _recipe()
    readme = (ROOT / "README.md").read_text()
    assert " ".join(recipe.split()) in " ".join(readme.split())  # its "Plain SQL" lines
    statements = [s.strip() for s in recipe.split(";") if s.strip()]
    assert statements[0] == "BEGIN" and statements[-1] == "COMMIT"
    where = re.search(r"WHERE (.+)", recipe)
    assert where, recipe
    condition = where.group(1).strip()  # the README's ratings are 1-5, these 1-10: both fit
    recalls = []
    for q in queries:
        with real.transaction():
            for statement in statements[1:-2]:  # the SET LOCALs
                real.execute(statement)
            found = real.execute(statements[-2].replace("$1", "%(q)s"), {"q": q}).fetchall()
        assert len(found) == K
        assert best_first([row[1] for row in found])
        recalls.append(recall([row[0] for row in found], exact(real, q, condition)))
    assert np.mean(recalls) >= 0.95, recalls


# --- bad filter values: named, and explained (issue 25) ------------------------------------------


def test_fixed_width_character_and_bit_columns_filter_on_their_whole_value(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    """`character(2)` and `bit(3)` without their length are one character or bit: a value of
    the column's width was refused (or, cast, cut to its first character)."""
    with real.transaction(force_rollback=True):
        real.execute(
            "ALTER TABLE reviews ADD COLUMN code character(2), ADD COLUMN flags bit(3), "
            "ADD COLUMN codes character(2)[]"
        )
        real.execute(
            "UPDATE reviews SET code = CASE WHEN id % 2 = 0 THEN 'ab' ELSE 'a' END, "
            "flags = CASE WHEN id % 3 = 0 THEN B'101' ELSE B'100' END, codes = ARRAY['xy']"
        )
        cases: list[tuple[dict[str, Any], str]] = [
            ({"code": "ab"}, "code = 'ab'"),
            ({"code": {"$in": ["ab", "zz"]}}, "code = 'ab'"),
            ({"code": "a"}, "code = 'a'"),
            ({"flags": "101"}, "flags = B'101'"),
            ({"codes": {"$eq": "{xy}"}}, "true"),
        ]
        for filter, where in cases:
            found = search(real, queries[0], filter)
            assert [key for key, _ in found] == exact(real, queries[0], where), filter
        # A bit(3) value keeps its length: compared as `bit varying`, the column would be cast,
        # and its B-tree index passed over.
        clause = real.execute(
            "SELECT f.clause FROM pgembed.models m, "
            "pgembed._filter_v1(m, '{\"flags\": \"101\"}', 5) f WHERE m.name = 'minilm'"
        ).fetchone()
        assert clause is not None and "::bit(3)" in clause[0], clause
        # ... and the plan reads the matching rows by that index.
        real.execute("CREATE INDEX reviews_flags ON reviews (flags)")
        real.execute("SET LOCAL enable_seqscan = off")
        with plans(real) as found_plans:
            assert search(real, queries[0], {"flags": "101"})
        assert "reviews_flags" in "\n".join(found_plans)


def test_in_with_null_lists_and_array_columns(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    """`$in` with a null matches the NULL rows too, as `{"col": null}` does (it matched none); a
    list given without `$in` and `$in` on an array column are errors that say so (a list was
    compared as its JSON text, and matched nothing)."""
    with real.transaction(force_rollback=True):
        real.execute("ALTER TABLE reviews ADD COLUMN maybe integer, ADD COLUMN tags text[]")
        real.execute("UPDATE reviews SET maybe = nullif(id % 3, 0), tags = ARRAY['x']")
        found = search(real, queries[0], {"maybe": {"$in": [1, None]}}, k=K)
        assert [key for key, _ in found] == exact(real, queries[0], "maybe = 1 OR maybe IS NULL")
        cases: list[tuple[dict[str, Any], str]] = [
            ({"cat": [1, 2]}, 'filter on "cat": $eq needs one value, not a JSON array'),
            ({"cat": {"$gt": {"a": 1}}}, 'filter on "cat": $gt needs one value, not a JSON obj'),
            ({"tags": {"$in": ["{x}"]}}, 'filter on "tags": $in on an array column'),
        ]
        for filter, message in cases:
            with pytest.raises(psycopg.errors.InvalidParameterValue) as caught, real.transaction():
                search(real, queries[0], filter)
            assert str(caught.value).startswith(message), caught.value


def test_a_time_zone_offset_moves_a_timestamp_columns_value(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    """A `timestamp` column compares UTC wall-clock time: a value's offset is applied, as for a
    Python datetime (sent as UTC); the cast to `timestamp` ignored it."""
    with real.transaction(force_rollback=True):
        real.execute("ALTER TABLE reviews ADD COLUMN created timestamp")
        real.execute("UPDATE reviews SET created = '2020-01-01'::timestamp + id * interval '1 min'")
        cases: list[tuple[dict[str, Any], str]] = [
            ({"created": {"$lt": "2020-01-01T12:00:00+05:00"}}, "created < '2020-01-01 07:00'"),
            ({"created": {"$gte": "2020-01-01 07:00"}}, "created >= '2020-01-01 07:00'"),
            ({"created": {"$in": ["2020-01-01T05:01:00+05:00"]}}, "created = '2020-01-01 00:01'"),
        ]
        for filter, where in cases:
            found = search(real, queries[0], filter)
            assert [key for key, _ in found] == exact(real, queries[0], where), filter


def test_a_json_filter_number_keeps_its_digits(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    """--filter (and HTTP) read a JSON number as a decimal: a float made 4.50000000000000001 4.5,
    which matched the other rows, and refused 1e400, which a numeric column can compare."""
    with real.transaction(force_rollback=True):
        real.execute(
            "ALTER TABLE reviews ADD COLUMN price numeric, ADD COLUMN score float8, "
            "ADD COLUMN meta jsonb"
        )
        real.execute(
            "UPDATE reviews SET price = 4.5 + (id % 2) * 1e-17, score = id, "
            """meta = jsonb_build_object('score', 4.5 + (id % 3) * 0.25)"""
        )
        cases = [
            ('{"price": 4.50000000000000001}', "mod(id, 2) = 1"),
            ('{"price": {"$lt": 1e400}, "cat": {"$lt": 10}}', "cat < 10"),
            ('{"meta": {"$eq": {"score": 4.5}}}', "mod(id, 3) = 0"),  # a number in a jsonb value
        ]
        for text, where in cases:
            found = real.execute(
                "SELECT key::integer FROM pgembed.search('minilm', %s, %s, %s)",
                (queries[0], K, Jsonb(planner.parse_filter(text), dumps=planner.filter_json)),
            ).fetchall()
            assert [key for (key,) in found] == exact(real, queries[0], where), text
        too_big = Jsonb(planner.parse_filter('{"score": 1e400}'), dumps=planner.filter_json)
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            real.execute("SELECT pgembed.search('minilm', %s, %s, %s)", (queries[0], K, too_big))
        assert str(caught.value).startswith('filter on "score": 1000000000')
        assert "… is not a value of its type double precision" in str(caught.value)
    with pytest.raises(UsageError, match="the number '1e9999999999999999999' is out of range"):
        planner.parse_filter('{"price": 1e9999999999999999999}')


def test_a_filter_compares_an_extensions_type_and_jsonb_as_the_column_does(
    real: psycopg.Connection, queries: list[Vector]
) -> None:
    """The helpers run with search_path pg_catalog: `=` between two citext values found text's
    operator through the implicit cast, and compared case-sensitively (no row for a lower-case
    address). A jsonb column's string value was read again as JSON: "abc" was refused, and the
    string '{"r": 1}' matched the object {"r": 1} instead of itself. A json column, which has no
    `=`, was an error."""
    with real.transaction(force_rollback=True):
        real.execute("CREATE EXTENSION citext")
        real.execute(
            "ALTER TABLE reviews ADD COLUMN email citext, ADD COLUMN meta jsonb, "
            "ADD COLUMN doc json"
        )
        real.execute(
            "UPDATE reviews SET email = CASE WHEN id % 11 <> 0 THEN 'User' || id % 7 "
            "|| '@Example.com' END, meta = CASE id % 3 WHEN 0 THEN to_jsonb('{\"r\": 1}'::text) "
            "WHEN 1 THEN '{\"r\": 1}'::jsonb ELSE to_jsonb('abc'::text) END"
        )
        real.execute("UPDATE reviews SET doc = meta::json")
        # Domains over them compare as their base types (a domain's own `=`, which whoever may
        # CREATE in citext's schema could add, is never the one looked up).
        real.execute("CREATE DOMAIN mail AS citext")
        real.execute("CREATE DOMAIN meta_data AS jsonb")
        real.execute("ALTER TABLE reviews ADD COLUMN mail mail, ADD COLUMN extra meta_data")
        real.execute("UPDATE reviews SET mail = email, extra = meta")
        real.execute("ANALYZE reviews")
        cases: list[tuple[dict[str, Any], str]] = [
            ({"email": "user3@example.com"}, "email = 'USER3@EXAMPLE.COM'"),
            (
                {"email": {"$in": ["USER3@example.com", "user4@example.com", None]}},
                "email IN ('user3@example.com', 'user4@example.com') OR email IS NULL",
            ),
            ({"email": {"$ne": "user3@example.com"}}, "email IS DISTINCT FROM 'user3@example.com'"),
            ({"email": {"$ne": None}}, "email IS NOT NULL"),
            ({"email": {"$gte": "USER5@"}}, "email >= 'user5@'"),
            ({"email": {"$lt": "USER2@"}, "cat": {"$lt": 500}}, "email < 'user2@' AND cat < 500"),
            ({"meta": '{"r": 1}'}, "meta = to_jsonb('{\"r\": 1}'::text)"),
            ({"meta": "abc"}, "meta = '\"abc\"'"),
            ({"meta": {"$eq": {"r": 1}}}, "meta = '{\"r\": 1}'"),
            ({"meta": {"$in": ["abc", {"r": 1}]}}, "meta IN ('\"abc\"', '{\"r\": 1}')"),
            ({"doc": "abc"}, "meta = '\"abc\"'"),  # json has no `=`: compared as jsonb
            ({"doc": {"$ne": {"r": 1}}}, "meta <> '{\"r\": 1}'"),
            ({"meta": {"$ne": None}}, "meta IS NOT NULL"),
            ({"mail": {"$in": ["USER3@example.com"]}}, "email = 'user3@example.com'"),
            ({"mail": {"$ne": "user3@example.com"}}, "email IS DISTINCT FROM 'user3@example.com'"),
            ({"mail": {"$lt": "USER2@"}}, "email < 'user2@'"),
            ({"extra": "abc"}, "meta = '\"abc\"'"),
        ]
        for filter, where in cases:
            wanted = exact(real, queries[0], where)
            assert wanted, where
            assert [key for key, _ in search(real, queries[0], filter)] == wanted, filter
        # filter_note's "no row has" compares as text: not for citext.
        note = "SELECT pgembed.filter_note('minilm', %s)"
        assert real.execute(note, ('{"email": "user3@example.com"}',)).fetchone() == (None,)


def test_a_value_of_the_wrong_type_names_its_column(
    real_url: str, real: psycopg.Connection, queries: list[Vector]
) -> None:
    for filter in ({"rating": "eight"}, {"cat": {"$in": [1, "two"]}}):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            search(real, queries[0], filter)
        column = next(iter(filter))
        assert str(caught.value).splitlines()[0].startswith(f'filter on "{column}": ')
    result = cli(
        "--database-url",
        real_url,
        "query",
        "--model",
        "minilm",
        "--similar-to",
        "1",
        "--filter",
        '{"rating": "eight"}',
    )
    assert result.exit_code != 0
    assert 'filter on "rating": "eight" is not a value of its type integer' in result.output


def test_a_text_value_no_row_has_is_named_with_the_columns_values(
    real_url: str, real: psycopg.Connection, queries: list[Vector]
) -> None:
    assert search(real, queries[0], {"sentiment": "positive"}) == []
    note = 'no row has "sentiment" = "positive" (its values: "neg", "pos")'
    for filter in ('{"sentiment": "positive"}', '{"sentiment": {"$in": ["positive"]}}'):
        assert real.execute("SELECT pgembed.filter_note('minilm', %s)", (filter,)).fetchone() == (
            note,
        )
    # A value some row has, a column of many values, a range, a list with a null (it matches the
    # NULL rows, which the note does not weigh): the statistics cannot say more.
    for filter in (
        '{"sentiment": "pos"}',
        '{"body": "nothing"}',
        '{"cat": {"$gt": 5000}}',
        '{"sentiment": {"$in": ["positive", null]}}',
    ):
        assert real.execute("SELECT pgembed.filter_note('minilm', %s)", (filter,)).fetchone() == (
            None,
        )
    args = ["--database-url", real_url, "query", "--model", "minilm", "--similar-to", "1"]
    result = cli(*args, "--filter", '{"sentiment": "positive"}')
    assert result.exit_code != 0 and f"no rows: {note}" in result.output
    result = cli(*args, "--filter", '{"cat": {"$gt": 5000}}')
    assert result.exit_code == 0 and result.output.strip() == "no rows match the filter"


# --- a filtered column without an index, on a big table: say so (issue 23) ----------------------

INDEX_NOTE = (
    "no index on public.reviews (rating), which the filter reads: "
    "CREATE INDEX ON public.reviews (rating) makes selective filters fast"
)


def index_note(conn: psycopg.Connection, model: str, filter: dict[str, Any]) -> str | None:
    row = conn.execute("SELECT pgembed.filter_index_note(%s, %s)", (model, Jsonb(filter)))
    found = row.fetchone()
    assert found is not None
    return found[0]  # type: ignore[no-any-return]


def test_a_filtered_column_without_an_index_gets_a_note_on_a_big_table(db_url: str) -> None:
    """25,000 narrow rows (no vectors needed: the note reads the catalog and the table's size):
    past pgembed.exact_rows (20,000), where a selective filter is read exactly, a column no index
    leads with means a scan of the whole table."""
    with db.connection(db_url) as conn:
        conn.execute(
            "CREATE TABLE reviews (id integer PRIMARY KEY, rating integer, cat integer, "
            '"Stars" integer, body text)'
        )
        models.add(
            conn, models.AddRequest("minilm", "reviews", "body", index=False, precision="fp32")
        )
        conn.execute("ALTER TABLE reviews DISABLE TRIGGER USER")  # no vectors to queue
        conn.execute(
            "INSERT INTO reviews SELECT i, i % 10 + 1, i % 1000, i % 5, 'review ' || i "
            "FROM generate_series(1, 25000) i"
        )
        conn.execute("CREATE INDEX ON reviews (cat)")
        conn.execute("CREATE INDEX ON reviews (cat, rating)")  # not led by rating: no help
        conn.execute("ANALYZE reviews")
        assert index_note(conn, "minilm", {"rating": {"$gte": 8}}) == INDEX_NOTE
        assert index_note(conn, "minilm", {"cat": 7, "rating": 3}) == INDEX_NOTE
        assert index_note(conn, "minilm", {"cat": {"$lt": 10}}) is None  # indexed
        assert index_note(conn, "minilm", {"id": {"$in": [1, 2]}}) is None  # its primary key
        # Identifiers quoted; several columns, one line.
        assert index_note(conn, "minilm", {"rating": 3, "Stars": 4}) == (
            'no index on public.reviews (rating), ("Stars"), which the filter reads: '
            'CREATE INDEX ON public.reviews (rating); CREATE INDEX ON public.reviews ("Stars") '
            "make selective filters fast"
        )
        # No filter, or one the search refuses anyway (its own error says why).
        assert index_note(conn, "minilm", {}) is None
        assert index_note(conn, "minilm", {"nope": 1}) is None
        # The cutoff is pgembed.exact_rows: above the table's size, or 0 (never read exactly).
        for cutoff in ("30000", "0"):
            conn.execute("SELECT set_config('pgembed.exact_rows', %s, false)", (cutoff,))
            assert index_note(conn, "minilm", {"rating": 3}) is None
        conn.execute("RESET pgembed.exact_rows")
        conn.execute("CREATE INDEX ON reviews (rating)")
        assert index_note(conn, "minilm", {"rating": {"$gte": 8}}) is None


def test_pgembed_query_says_when_a_filtered_column_has_no_index(
    real_url: str, real: psycopg.Connection
) -> None:
    """The 2,500 rows are below the default cutoff: no note. With pgembed.exact_rows = 1,000 (set
    for the connection, as a user may) they are past it: `rating` has no index, `cat` has one."""
    assert index_note(real, "minilm", {"rating": {"$gte": 8}}) is None
    args = ["query", "--model", "minilm", "--similar-to", "1", "-k", "3"]
    result = cli("--database-url", real_url, *args, "--filter", '{"rating": {"$gte": 8}}')
    assert result.exit_code == 0 and "note:" not in result.stderr, result.output
    big = real_url + "&options=-c%20pgembed.exact_rows%3D1000"
    result = cli("--database-url", big, *args, "--filter", '{"rating": {"$gte": 8}}')
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [f"pgembed: note: {INDEX_NOTE}"]
    assert len(result.stdout.splitlines()) == 3  # the hits all the same
    result = cli("--database-url", big, *args, "--filter", '{"cat": {"$lt": 10}}')
    assert result.exit_code == 0 and result.stderr == "", result.output
