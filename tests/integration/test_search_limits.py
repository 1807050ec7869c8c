"""The SQL helpers' limits: one clear error, or a result, never an internal failure."""

from __future__ import annotations

import re

import psycopg
import pytest

import pgembed
from pgembed import db
from pgembed.errors import UsageError


def test_hybrid_search_takes_any_k(shop_url: str) -> None:
    with db.connection(shop_url) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM pgembed.hybrid_search('minilm', "
            "(SELECT embedding_minilm FROM reviews LIMIT 1), 'battery', 2147483647)"
        ).fetchone()
        total = conn.execute("SELECT count(*) FROM reviews").fetchone()
    assert rows is not None and total is not None and 0 < rows[0] <= total[0]


def test_hybrid_search_query_text_is_bounded(shop_url: str) -> None:
    with db.connection(shop_url) as conn:
        query = (
            "SELECT count(*) FROM pgembed.hybrid_search('minilm', "
            "(SELECT embedding_minilm FROM reviews LIMIT 1), %s, 5)"
        )
        # The longest text accepted parses (no "stack depth limit exceeded") ...
        assert conn.execute(query, ("battery life " * 769,)).fetchone() == (5,)
        # ... and a longer one is one clear error.
        with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="at most 10000"):
            conn.execute(query, ("battery " * 20000,))


def test_hybrid_search_takes_a_repeated_word_once_and_at_most_255_nodes(shop_url: str) -> None:
    """A plain AND, or OR, of words is searched with each word once (an audit's text of one word
    2,000 times ran for minutes: ts_rank_cd pays for every copy); past 255 nodes, one clear error.
    A query the full-text index cannot serve (a word's absence) leaves the vector ranking alone,
    instead of reading every row's text."""
    query = (
        "SELECT key, score FROM pgembed.hybrid_search('minilm', "
        "(SELECT embedding_minilm FROM reviews ORDER BY id LIMIT 1), %s, 5)"
    )
    with db.connection(shop_url) as conn:
        once = conn.execute(query, ("battery life",)).fetchall()
        assert once == conn.execute(query, ("battery life " * 700,)).fetchall()
        either = conn.execute(query, ("battery or life",)).fetchall()
        assert either == conn.execute(query, ("battery or life or " * 300,)).fetchall()
        mixed = conn.execute(query, ("battery life or charger",)).fetchall()
        twice = " or ".join(["battery life life battery or charger"] * 60)
        assert mixed == conn.execute(query, (twice,)).fetchall()
        # Phrases (a hyphenated word) and NOTs in the text too (a review: 5.7 s on 20,000 rows).
        for text in ("battery long-lasting or charger -screen", "it's o'reilly battery"):
            once = conn.execute(query, (text,)).fetchall()
            assert once == conn.execute(query, (" or ".join([text] * 60),)).fetchall(), text
        # NOT and phrases are kept as written.
        assert conn.execute(query, ('"battery life" or charger -screen',)).fetchall()
        nearest = conn.execute(
            "SELECT key FROM pgembed.search('minilm', "
            "(SELECT embedding_minilm FROM reviews ORDER BY id LIMIT 1), 5)"
        ).fetchall()
        for absent in ("-zzzqqq", "battery or -screen"):
            keys = [(key,) for key, _ in conn.execute(query, (absent,)).fetchall()]
            assert keys == nearest, absent
        words = " ".join(f"word{i}" for i in range(200))
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 255"):
            conn.execute(query, (words,))
    with pgembed.Client(shop_url) as client, pytest.raises(UsageError, match="at most 255"):
        client.hybrid_search("minilm", words)


@pytest.mark.parametrize(
    ("setting", "search"),
    [
        (
            "pgembed.fulltext_rows",
            "SELECT count(*) FROM pgembed.hybrid_search('minilm', "
            "(SELECT embedding_minilm FROM reviews ORDER BY id LIMIT 1), 'battery', 5)",
        ),
        (
            "pgembed.exact_rows",
            "SELECT count(*) FROM pgembed.search('minilm', "
            "(SELECT embedding_minilm FROM reviews ORDER BY id LIMIT 1), 5, '{\"rating\": 5}')",
        ),
    ],
)
def test_a_rows_setting_that_is_not_a_count_is_one_clear_error(
    shop_url: str, setting: str, search: str
) -> None:
    """A cutoff in rows that is not a number from 0 up says which setting, not a cast's
    `invalid input syntax for type double precision` (an audit's `abc`); `NaN` and `-5`, which
    the cast took, meant never or always without a word."""
    with db.connection(shop_url) as conn:
        for bad in ("abc", "5,000", "NaN", "-5", "-Infinity", "1e400"):
            conn.execute("SELECT set_config(%s, %s, false)", (setting, bad))
            message = f"{setting} must be a number of rows from 0 up, not '{bad}'"
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=re.escape(message)):
                conn.execute(search)
        for good in (" 7 ", "0", "2.5e3", ""):
            conn.execute("SELECT set_config(%s, %s, false)", (setting, good))
            assert conn.execute(search).fetchone() == (5,), good


@pytest.mark.parametrize("filter", [None, '{"rating": 5}'], ids=["index", "filtered"])
def test_an_ef_search_setting_out_of_range_names_pgembed_ef_search(
    shop_url: str, filter: str | None
) -> None:
    """`SET pgembed.ef_search = 'x'` was refused as `invalid value for parameter
    "hnsw.ef_search"`, a setting the user never made."""
    search = "SELECT count(*) FROM pgembed.search('minilm', %s, 5, %s)"
    with db.connection(shop_url) as conn:
        row = conn.execute("SELECT embedding_minilm FROM reviews ORDER BY id LIMIT 1").fetchone()
        assert row is not None
        q = row[0]
        for bad in ("x", "0", "1001", "-5", "2.5", "99999"):
            conn.execute("SELECT set_config('pgembed.ef_search', %s, false)", (bad,))
            message = f'pgembed.ef_search must be a whole number from 1 to 1000, not "{bad}"'
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=re.escape(message)):
                conn.execute(search, (q, filter))
        for good in ("1", "1000", ""):
            conn.execute("SELECT set_config('pgembed.ef_search', %s, false)", (good,))
            assert conn.execute(search, (q, filter)).fetchone() == (5,), good
