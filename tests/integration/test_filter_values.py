"""Filter values as the column reads them, and bad ones named and explained (issue 25), on the
2,500 real reviews' vectors of tests/recall_helpers.py; a filtered column without an index on a
big table gets a note (issue 23)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from pgvector import Vector
from psycopg.types.json import Jsonb
from recall_helpers import K, exact, search

from helpers import cli, plans
from pgembed import db
from pgembed.errors import UsageError
from pgembed.lifecycle import models
from pgembed.search import planner

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
