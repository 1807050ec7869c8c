"""The SQL helpers pgembed.search / similar / hybrid_search, called as a user would: plain SQL."""

from __future__ import annotations

import difflib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector import Vector
from roles_helpers import with_user

from helpers import cli, plans
from pgembed import db, texts
from pgembed.catalog import registry
from pgembed.search import planner, vectors

BATTERY = "the battery dies before lunch"


@pytest.fixture
def shop(shop_url: str) -> Iterator[psycopg.Connection]:
    with db.connection(shop_url) as conn:
        yield conn


@pytest.fixture
def items(items_url: str) -> Iterator[psycopg.Connection]:
    with db.connection(items_url) as conn:
        yield conn


def qvec(conn: psycopg.Connection, text: str) -> Vector:
    return Vector(vectors.embed_query(registry.get(conn, "minilm"), text))


def random_query(seed: int = 1) -> Vector:
    v = np.random.default_rng(seed).normal(size=384).astype(np.float32)
    return Vector(v / np.linalg.norm(v))


def rows(conn: psycopg.Connection, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    return conn.execute(statement, params).fetchall()


def test_public_signatures_are_security_invoker(conn: psycopg.Connection) -> None:
    found = rows(
        conn,
        "SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid), "
        "p.prosecdef FROM pg_proc p WHERE p.pronamespace = 'pgembed'::regnamespace "
        "AND p.proname IN ('search', 'similar', 'hybrid_search') ORDER BY 1",
    )
    assert found == [
        (
            "hybrid_search",
            "model text, query vector, query_text text, k integer DEFAULT 10, "
            "filter jsonb DEFAULT NULL::jsonb",
            "TABLE(key text, score double precision)",
            False,
        ),
        (
            "search",
            "model text, query vector, k integer DEFAULT 10, filter jsonb DEFAULT NULL::jsonb",
            "TABLE(key text, similarity double precision)",
            False,
        ),
        (
            "similar",
            "model text, key text, k integer DEFAULT 10, filter jsonb DEFAULT NULL::jsonb",
            "TABLE(key text, similarity double precision)",
            False,
        ),
    ]


def test_search_is_plain_sql_nearest_first(shop: psycopg.Connection) -> None:
    shop.execute("SET enable_indexscan = off")  # exact on both sides: the same rows
    q = qvec(shop, BATTERY)
    hits = rows(shop, "SELECT key, similarity FROM pgembed.search('minilm', %s, 5)", q)
    plain = rows(
        shop,
        "SELECT id::text, 1 - (embedding_minilm <=> %s) FROM reviews "
        "ORDER BY embedding_minilm <=> %s LIMIT 5",
        q,
        q,
    )
    assert [key for key, _ in hits] == [key for key, _ in plain]
    np.testing.assert_allclose([s for _, s in hits], [s for _, s in plain], atol=1e-6)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert hits[0][0] == "1"  # "The battery is the weak point. ... by lunchtime ..."
    assert len(rows(shop, "SELECT * FROM pgembed.search('minilm', %s)", q)) == 10  # k's default


def test_explain_shows_the_hnsw_index(items: psycopg.Connection) -> None:
    q = random_query()
    with plans(items) as found:
        items.execute("SELECT * FROM pgembed.search('minilm', %s, 10)", (q,))
        items.execute("SELECT * FROM pgembed.similar('minilm', '5', 10)")
    helper_plans = [p for p in found if "ORDER BY t.embedding_minilm OPERATOR(public.<=>)" in p]
    assert len(helper_plans) == 2
    assert all("Index Scan using pgembed_minilm_hnsw on items t" in p for p in helper_plans)


def test_filter_matching_2_percent_returns_k_rows(items: psycopg.Connection) -> None:
    q = random_query()
    rare = {"bucket": "rare"}
    statement = "SELECT key FROM pgembed.search('minilm', %s, 10, %s)"
    assert items.execute("SELECT count(*) FROM items WHERE bucket = 'rare'").fetchone() == (60,)
    # Left alone, the helper reads the 60 matches exactly; force the HNSW path to test it.
    items.execute("SET pgembed.exact_rows = 0")
    items.execute("SET enable_seqscan = off")
    with plans(items) as found:
        keys = [k for (k,) in rows(items, statement, q, json.dumps(rare))]
    assert any("Index Scan using pgembed_minilm_hnsw" in p for p in found)
    assert len(keys) == 10
    assert all(int(k) % 50 == 0 for k in keys)
    similar = rows(
        items, "SELECT key FROM pgembed.similar('minilm', '0', 10, %s)", json.dumps(rare)
    )
    assert len(similar) == 10 and ("0",) not in similar
    # Plain SQL without iterative scans (pgvector's default) runs the index dry early.
    plain = "SELECT id FROM items WHERE bucket = 'rare' ORDER BY embedding_minilm <=> %s LIMIT 10"
    assert len(rows(items, plain, q)) < 10


def test_a_long_in_list_is_one_hash_lookup_per_row(items: psycopg.Connection) -> None:
    """$in's values are a constant array to the planner (hashed), not compared with each row one
    by one: 100,000 values over 3,000 rows took 20 s that way."""
    q = random_query()
    wanted = [str(n) for n in range(0, 100_000, 2)]  # 50,000 values, the even keys among them
    statement = "SELECT key FROM pgembed.search('minilm', %s, 10, %s)"
    started = time.perf_counter()
    with plans(items) as found:
        keys = [k for (k,) in rows(items, statement, q, json.dumps({"id": {"$in": wanted}}))]
    took = time.perf_counter() - started
    even = rows(
        items,
        "SELECT id::text FROM items WHERE id %% 2 = 0 ORDER BY embedding_minilm <=> %s LIMIT 10",
        q,
    )
    assert keys == [k for (k,) in even]
    filtered = [p for p in found if "ANY ('{0,2,4," in p]
    assert filtered and not any("SubPlan" in p or "InitPlan" in p for p in filtered)
    assert took < 10, took


def test_python_and_sql_agree_on_blank_characters(shop: psycopg.Connection, shop_url: str) -> None:
    """texts.has_text (a query text) and pgembed._has_text_v1 (a row's text) treat the same
    characters as blank, on every code point: a query of zero-width spaces is refused as empty,
    as a row of them is never embedded."""
    sql_blank = {
        c
        for (c,) in rows(
            shop,
            "SELECT c FROM generate_series(1, 1114111) c "
            "WHERE c NOT BETWEEN 55296 AND 57343 AND NOT pgembed._has_text_v1(chr(c))",
        )
    }
    python_blank = {
        c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF and not texts.has_text(chr(c))
    }
    # The pattern the sync worker skips a text's leading blanks with, read by PostgreSQL.
    leading_blank = {
        c
        for (c,) in rows(
            shop,
            "SELECT c FROM generate_series(1, 1114111) c "
            "WHERE c NOT BETWEEN 55296 AND 57343 AND substring(chr(c), %s) <> ''",
            texts.LEADING_BLANKS,
        )
    }
    assert 0x200B in sql_blank and 0x20 in sql_blank and 0x61 not in sql_blank
    assert python_blank == sql_blank == leading_blank
    with pytest.raises(planner.RequestError, match="the query text is empty"):
        planner.SearchRequest("minilm", text="\u200b\u200b \ufeff")
    result = cli("--database-url", shop_url, "query", "--model", "minilm", "\u200b\u200b")
    assert result.exit_code != 0 and "the query text is empty" in result.output, result.output


def test_ef_search_model_default_and_user_setting(items: psycopg.Connection) -> None:
    q = random_query()
    # A row-level security policy that records the hnsw.ef_search the index scan runs with (RLS
    # binds a non-superuser, hence the role). A policy counts as a filter (the search's effort is
    # divided by the share of rows it shows): the planner takes `probe() IS NOT NULL` to show
    # 99.5 % of them, and the walk is forced (pgembed.exact_rows = 0: 3,000 rows would be read
    # exactly).
    role = f"pgembed_probe_{uuid.uuid4().hex[:8]}"
    items.execute(
        "CREATE FUNCTION probe() RETURNS boolean LANGUAGE sql VOLATILE AS $$ "
        "SELECT set_config('probe.ef_search', current_setting('hnsw.ef_search'), false) "
        "IS NOT NULL $$"
    )
    items.execute("ALTER TABLE items ENABLE ROW LEVEL SECURITY")
    items.execute("CREATE POLICY probe ON items FOR SELECT USING (probe() IS NOT NULL)")
    items.execute(f"CREATE ROLE {role}")
    items.execute(f"GRANT USAGE ON SCHEMA pgembed TO {role}")
    items.execute(f"GRANT SELECT ON items, pgembed.models TO {role}")
    items.execute(f"SET ROLE {role}")
    items.execute("SET pgembed.exact_rows = 0")

    def searched(k: int = 20) -> tuple[int, str]:
        row = items.execute("SELECT count(*) FROM pgembed.search('minilm', %s, %s)", (q, k))
        seen = items.execute("SELECT current_setting('probe.ef_search')").fetchone()
        return int((row.fetchone() or (0,))[0]), str((seen or ("",))[0])

    try:
        # pgembed's default for 3,000 rows (49; 80 at 10,000), over the share shown: 50.
        assert searched() == (20, "50")
        assert searched(100) == (100, "100")  # and at least k
        items.execute("RESET ROLE")
        items.execute("UPDATE pgembed.models SET ef_search = 60 WHERE name = 'minilm'")
        items.execute(f"SET ROLE {role}")
        assert searched() == (20, "61")  # the model's default (`pgembed tune` sets it), 60
        items.execute("SET hnsw.ef_search = 70")
        assert searched() == (20, "70")  # the user's SET wins
        with items.transaction():
            items.execute("SET LOCAL hnsw.ef_search = 30")
            items.execute("SET LOCAL hnsw.iterative_scan = strict_order")
            assert searched(100) == (100, "30")  # as it is: iterative scans go past ef_search
            # The helper's own settings end with it: the caller's stay as they were.
            assert items.execute("SHOW hnsw.ef_search").fetchone() == ("30",)
            assert items.execute("SHOW hnsw.iterative_scan").fetchone() == ("strict_order",)
        # pgvector's built-in values cannot be told from unset ones: they mean "pgembed's choice".
        items.execute("SET hnsw.ef_search = 40")
        items.execute("SET hnsw.iterative_scan = off")
        assert searched() == (20, "61")
        # pgembed.ef_search wins over everything, 40 included (`pgembed query --ef-search 40`).
        items.execute("SET pgembed.ef_search = 40")
        assert searched() == (20, "40")
        filtered = "SELECT count(*) FROM pgembed.search('minilm', %s, 5, '{\"id\": {\"$gte\": 0}}')"
        assert items.execute(filtered, (q,)).fetchone() == (5,)
        seen = items.execute("SELECT current_setting('probe.ef_search')").fetchone()
        assert seen == ("40",)  # the filtered (dynamic) path reads it too
        items.execute("RESET pgembed.ef_search")
        items.execute("RESET pgembed.exact_rows")
        for setting, value in [
            ("hnsw.ef_search", "40"),
            ("hnsw.iterative_scan", "off"),
            ("plan_cache_mode", "auto"),
            ("enable_seqscan", "on"),
        ]:
            assert items.execute(f"SHOW {setting}").fetchone() == (value,)
    finally:
        items.execute("RESET ROLE")
        items.execute(f"DROP OWNED BY {role}")
        items.execute(f"DROP ROLE {role}")


FILTERS: list[tuple[dict[str, Any], str]] = [
    ({"category": "phones"}, "category = 'phones'"),
    ({"rating": {"$eq": 5}}, "rating = 5"),
    ({"rating": {"$ne": 5}}, "rating <> 5"),
    ({"rating": {"$gt": 3}}, "rating > 3"),
    ({"rating": {"$gte": 4}}, "rating >= 4"),
    ({"rating": {"$lt": 2}}, "rating < 2"),
    ({"rating": {"$lte": 2}}, "rating <= 2"),
    ({"category": {"$in": ["phones", "laptops"]}}, "category IN ('phones', 'laptops')"),
    (
        {"rating": {"$in": [1, 5]}, "category": "chargers"},
        "rating IN (1, 5) AND category = 'chargers'",
    ),
    ({"rating": {"$gte": 2, "$lte": 3}}, "rating BETWEEN 2 AND 3"),
    ({"product": "Pebble S2 phone"}, "product = 'Pebble S2 phone'"),
]


@pytest.mark.parametrize(("filter", "where"), FILTERS, ids=[w for _, w in FILTERS])
def test_filter_operators(shop: psycopg.Connection, filter: dict[str, Any], where: str) -> None:
    # Exact search on both sides, so the results must match row for row; the index path with a
    # filter is tested on the big table above.
    shop.execute("SET enable_indexscan = off")
    q = qvec(shop, BATTERY)
    hits = rows(shop, "SELECT key FROM pgembed.search('minilm', %s, 30, %s)", q, json.dumps(filter))
    # The same search written by hand with the WHERE clause.
    expected = rows(
        shop,
        f"SELECT id::text FROM reviews WHERE {where} ORDER BY embedding_minilm <=> %s LIMIT 30",
        q,
    )
    assert hits and hits == expected


def test_null_filters(items: psycopg.Connection) -> None:
    q = random_query()

    def keys(filter: dict[str, Any]) -> list[int]:
        found = rows(
            items, "SELECT key FROM pgembed.search('minilm', %s, 20, %s)", q, json.dumps(filter)
        )
        return [int(k) for (k,) in found]

    assert len(keys({"note": None})) == 20 and all(k % 3 == 0 for k in keys({"note": None}))
    not_null = keys({"note": {"$ne": None}})
    assert len(not_null) == 20 and all(k % 3 != 0 for k in not_null)
    # $ne keeps rows whose column is NULL (as MongoDB does).
    assert any(k % 3 == 0 for k in keys({"note": {"$ne": "note 1"}}))


HOSTILE_KEYS = [
    "rating; DROP TABLE reviews",
    'rating" OR 1=1 --',
    "t.rating",
    "",
    "id) OR (1=1",
    "rating\nOR true",
]
REFUSED = [
    *({key: 1} for key in HOSTILE_KEYS),
    {"rating": {"$where": "1=1"}},
    {"rating": {"$gt": 1, "; DROP TABLE reviews": 1}},
    {"rating": {}},
    {"rating": {"$gt": None}},
    {"category": {"$in": "phones"}},
    {"rating": "1 OR 1=1"},
    {"rating": {"$gte": "4); DROP TABLE reviews; --"}},
    [1, 2],
    "rating = 1",
]


@pytest.mark.parametrize("filter", REFUSED, ids=[json.dumps(f) for f in REFUSED])
def test_hostile_filters_are_refused_with_one_line(shop: psycopg.Connection, filter: Any) -> None:
    q = qvec(shop, BATTERY)
    with pytest.raises(psycopg.DataError) as caught:
        shop.execute("SELECT * FROM pgembed.search('minilm', %s, 5, %s)", (q, json.dumps(filter)))
    message = caught.value.diag.message_primary or ""
    assert message and "\n" not in message
    assert shop.execute("SELECT count(*) FROM reviews").fetchone() == (324,)


HARMLESS = [
    {"category": "phones' OR '1'='1"},
    {"category": "x'); DROP TABLE reviews; --"},
    {"category": {"$in": ["phones", "') OR true --"]}},
    {"product": {"$gt": "z' OR 'a'='a"}},
]


@pytest.mark.parametrize("filter", HARMLESS, ids=[json.dumps(f) for f in HARMLESS])
def test_hostile_values_are_only_values(shop: psycopg.Connection, filter: dict[str, Any]) -> None:
    q = qvec(shop, BATTERY)
    hits = rows(shop, "SELECT key FROM pgembed.search('minilm', %s, 50, %s)", q, json.dumps(filter))
    keys = [int(k) for (k,) in hits]
    categories = {c for (c,) in rows(shop, "SELECT category FROM reviews WHERE id = ANY(%s)", keys)}
    assert categories <= {"phones"}  # at most the honest part of the $in matched
    assert shop.execute("SELECT count(*) FROM reviews").fetchone() == (324,)


def test_helper_errors_are_clear(shop: psycopg.Connection) -> None:
    q = qvec(shop, BATTERY)
    cases: list[tuple[str, tuple[Any, ...], str]] = [
        ("SELECT * FROM pgembed.search('nope', %s)", (q,), 'unknown model "nope"'),
        ("SELECT * FROM pgembed.search('minilm', %s, 0)", (q,), "k must be a positive"),
        ("SELECT * FROM pgembed.search('minilm', '[1,2,3]')", (), "has 384 dimensions"),
        (
            "SELECT * FROM pgembed.hybrid_search('minilm', "
            "array_fill(0::real, ARRAY[384])::vector, 'battery')",
            (),
            "the query vector is all zeros",
        ),
        (
            "SELECT * FROM pgembed.search('minilm', array_fill(0::real, ARRAY[384])::vector)",
            (),
            "the query vector is all zeros",
        ),
        ("SELECT * FROM pgembed.similar('minilm', '9999')", (), 'no row with id = "9999"'),
        ("SELECT * FROM pgembed.similar('minilm', 'abc')", (), "invalid input syntax"),
        ("SELECT * FROM pgembed.hybrid_search('minilm', %s, NULL)", (q,), "query text is NULL"),
    ]
    for statement, params, message in cases:
        with pytest.raises(psycopg.Error, match=message):
            shop.execute(statement, params)
    shop.execute("INSERT INTO reviews VALUES (1000, 'p', 'phones', 3, 'queued, not embedded yet')")
    with pytest.raises(psycopg.Error, match="has no vector yet: run `pgembed sync`"):
        shop.execute("SELECT * FROM pgembed.similar('minilm', '1000')")
    # A blank text is never embedded: `pgembed sync` would not help.
    shop.execute("INSERT INTO reviews VALUES (1001, 'p', 'phones', 3, ' \u200b ')")
    with pytest.raises(psycopg.Error, match="has no text to embed"):
        shop.execute("SELECT * FROM pgembed.similar('minilm', '1001')")


def test_similar_excludes_the_row_itself(shop: psycopg.Connection) -> None:
    shop.execute("SET enable_indexscan = off")  # exact on both sides: the same rows
    hits = rows(shop, "SELECT key, similarity FROM pgembed.similar('minilm', '1', 5)")
    own = rows(
        shop,
        "SELECT s.key, s.similarity FROM reviews r, "
        "pgembed.search('minilm', r.embedding_minilm, 6) s WHERE r.id = 1",
    )
    assert own[0][0] == "1" and pytest.approx(own[0][1]) == 1.0
    assert hits == own[1:]
    phones = rows(
        shop, "SELECT key FROM pgembed.similar('minilm', '1', 5, '{\"category\": \"laptops\"}')"
    )
    categories = rows(
        shop,
        "SELECT DISTINCT category FROM reviews WHERE id = ANY(%s::int[])",
        [k for (k,) in phones],
    )
    assert len(phones) == 5 and categories == [("laptops",)]


def test_hybrid_search_is_reciprocal_rank_fusion(shop: psycopg.Connection) -> None:
    shop.execute("SET enable_indexscan = off")  # exact vector rankings on both sides
    text = "stamina of a goldfish"
    q = qvec(shop, text)
    got = rows(shop, "SELECT key, score FROM pgembed.hybrid_search('minilm', %s, %s, 5)", q, text)
    n = 40  # each ranking is cut at greatest(4k, 40)
    semantic = [k for (k,) in rows(shop, "SELECT key FROM pgembed.search('minilm', %s, %s)", q, n)]
    lexical = [
        k
        for (k,) in rows(
            shop,
            "SELECT r.id::text FROM reviews r, websearch_to_tsquery('english', %s) q "
            "WHERE to_tsvector('english', r.text) @@ q "
            "ORDER BY ts_rank_cd(to_tsvector('english', r.text), q) DESC, r.id LIMIT %s",
            text,
            n,
        )
    ]
    assert lexical  # "goldfish" is in one review
    fused: dict[str, float] = {}
    for ranking in (semantic, lexical):
        for rank, key in enumerate(ranking, start=1):
            fused[key] = fused.get(key, 0.0) + 1 / (60 + rank)
    expected = sorted(fused.items(), key=lambda kv: -kv[1])[:5]
    assert [k for k, _ in got] == [k for k, _ in expected]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in expected])
    assert got[0][0] == lexical[0]  # in both rankings, so first


def test_hybrid_search_needs_the_fulltext_index_and_uses_it(
    shop: psycopg.Connection, shop_url: str
) -> None:
    text = "battery"
    q = qvec(shop, text)
    statement = "SELECT * FROM pgembed.hybrid_search('minilm', %s, %s, 5, %s)"
    shop.execute("SET enable_seqscan = off")
    with plans(shop) as found:
        hits = rows(shop, statement, q, text, json.dumps({"rating": 5}))
    assert len(hits) == 5
    assert any("Bitmap Index Scan on pgembed_minilm_fts" in p for p in found)
    shop.execute("DROP INDEX pgembed_minilm_fts")
    with pytest.raises(
        psycopg.Error, match=r"no full-text index: run `pgembed model fulltext minilm`"
    ):
        shop.execute(statement, (q, text, None))
    result = cli("--database-url", shop_url, "model", "fulltext", "minilm")
    assert result.exit_code == 0, result.output
    assert "pgembed_minilm_fts is ready" in result.output
    assert len(rows(shop, statement, q, text, None)) == 5


def test_model_add_fulltext_and_remove(reviews: psycopg.Connection, db_url: str) -> None:
    result = cli(
        "--database-url",
        db_url,
        "model",
        "add",
        "minilm",
        "--table",
        "reviews",
        "--column",
        "body",
        "--fulltext",
        "--precision",
        "fp32",
    )
    assert result.exit_code == 0, result.output
    index = "SELECT indexdef FROM pg_indexes WHERE indexname = 'pgembed_minilm_fts'"
    (indexdef,) = reviews.execute(index).fetchone() or ("",)
    assert "gin" in indexdef and "to_tsvector('english'::regconfig, body)" in indexdef
    assert cli("--database-url", db_url, "model", "remove", "minilm").exit_code == 0
    assert reviews.execute(index).fetchone() is None


@pytest.fixture
def reader(shop: psycopg.Connection) -> Iterator[str]:
    """A role that may only SELECT the watched table (plus read the catalog)."""
    role = f"pgembed_reader_{uuid.uuid4().hex[:8]}"
    shop.execute(f"CREATE ROLE {role} LOGIN")
    try:
        shop.execute(f"GRANT USAGE ON SCHEMA pgembed TO {role}")
        shop.execute(f"GRANT SELECT ON pgembed.models, pgembed.migrations TO {role}")
        shop.execute(f"GRANT SELECT ON reviews TO {role}")
        yield role
    finally:
        shop.execute(f"DROP OWNED BY {role}")
        shop.execute(f"DROP ROLE {role}")


def test_read_only_role_sees_only_its_rows(
    shop: psycopg.Connection, shop_url: str, reader: str
) -> None:
    # Row-level security: the reader may see only well-rated reviews.
    shop.execute("ALTER TABLE reviews ENABLE ROW LEVEL SECURITY")
    shop.execute("CREATE POLICY good_only ON reviews FOR SELECT USING (rating >= 4)")
    q = qvec(shop, BATTERY)
    with db.connection(with_user(shop_url, reader)) as conn:
        for statement, params in [
            ("SELECT key FROM pgembed.search('minilm', %s, 10)", (q,)),
            ("SELECT key FROM pgembed.similar('minilm', '16', 10)", ()),
            ("SELECT key FROM pgembed.hybrid_search('minilm', %s, 'battery', 10)", (q,)),
        ]:
            keys = [int(k) for (k,) in conn.execute(statement, params).fetchall()]
            assert len(keys) == 10
            lowest = shop.execute("SELECT min(rating) FROM reviews WHERE id = ANY(%s)", (keys,))
            assert lowest.fetchone() in ((4,), (5,))
        # Row 1 (2 stars) is invisible to the reader: it cannot be used as a query either.
        with pytest.raises(psycopg.Error, match="no row with id"):
            conn.execute("SELECT * FROM pgembed.similar('minilm', '1')")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE reviews SET rating = 5")


def test_role_without_select_on_the_table_gets_nothing(
    shop: psycopg.Connection, shop_url: str, reader: str
) -> None:
    shop.execute(f"REVOKE SELECT ON reviews FROM {reader}")
    q = qvec(shop, BATTERY)
    with db.connection(with_user(shop_url, reader)) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM pgembed.search('minilm', %s)", (q,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM pgembed.similar('minilm', '1')")


# --- "did you mean": the SQL helpers' unknown model, as the Python side words it ------------------

WORDS = ["minlm", "MiniLM", "demo_men", "demo", "ghost", "note", "notes_v2", "", "x", "mini_lm"]
NAMES = ["demo_cls", "demo_mean", "minilm", "notes", "notes_v1", "minilm_v2", "abc"]


def test_close_names_follow_pythons_difflib(conn: psycopg.Connection) -> None:
    """pgembed._close_names_v1 (no extension: plain PL/pgSQL) picks what registry.unknown does,
    difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.6), in the same order."""
    rng = np.random.default_rng(5)
    letters = list("abcdeilmnost_")
    randoms = ["".join(rng.choice(letters, size=rng.integers(1, 12))) for _ in range(200)]
    cases = [(w, NAMES) for w in WORDS] + [(w, randoms[100:]) for w in randoms[:100]]
    for word, names in cases:
        found = conn.execute("SELECT pgembed._close_names_v1(%s, %s)", (word, names)).fetchone()
        expected = difflib.get_close_matches(word.lower(), names, n=3, cutoff=0.6)
        assert found == (expected,), word
    for a, b in zip(randoms[::2], randoms[1::2], strict=True):
        (ratio,) = conn.execute("SELECT pgembed._likeness_v1(%s, %s)", (a, b)).fetchone() or (0,)
        assert ratio == pytest.approx(difflib.SequenceMatcher(None, a, b).ratio()), (a, b)


def test_an_unknown_model_in_sql_says_which_name_was_meant(shop: psycopg.Connection) -> None:
    q = random_query()
    cases = [
        ("SELECT * FROM pgembed.search('minlm', %s)", (q,), '"minlm": did you mean "minilm"?'),
        ("SELECT * FROM pgembed.search('MiniLM', %s, 5, '{\"rating\": 1}')", (q,), '"MiniLM": '
         'did you mean "minilm"?'),
        ("SELECT * FROM pgembed.similar('minilmm', '1')", (), '"minilmm": did you mean "minilm"?'),
        ("SELECT * FROM pgembed.hybrid_search('mini', %s, 'x')", (q,), '"mini": did you mean '
         '"minilm"?'),
    ]  # fmt: skip
    for statement, params, meant in cases:
        with pytest.raises(psycopg.errors.UndefinedObject) as caught:
            shop.execute(statement, params)
        assert caught.value.diag.message_primary == (
            f"unknown model {meant} (see `pgembed model list`)"
        )
    # Nothing close: no guess.
    for name in ("ghost", "x" * 10_000):
        with pytest.raises(psycopg.errors.UndefinedObject) as caught:
            shop.execute("SELECT * FROM pgembed.search(%s, %s)", (name, q))
        assert caught.value.diag.message_primary == (
            f'unknown model "{name}": see `pgembed model list`'
        )
