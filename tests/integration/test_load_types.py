"""`pgembed load` keeps types (inferred or --types), and bad files load nothing: invalid UTF-8
and a cut gzip are one line each."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import psycopg

import pgembed
from helpers import cli
from pgembed.lifecycle import models
from pgembed.sync import worker

IMDB = Path(__file__).parent.parent / "data" / "imdb-reviews-excerpt.csv"


def load(db_url: str, *args: str) -> tuple[int, str]:
    result = cli("--database-url", db_url, "load", *args)
    return result.exit_code, result.output


def column_types(conn: psycopg.Connection, table: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT attname, pg_catalog.format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (table,),
    ).fetchall()
    return dict(rows)


def test_imdb_ratings_are_numbers_and_filter_like_sql(
    conn: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    packed = tmp_path / "reviews.csv.gz"
    packed.write_bytes(gzip.compress(IMDB.read_bytes()))
    code, out = load(db_url, str(packed), "--table", "imdb")
    assert code == 0, out
    assert "created public.imdb: 40 records read, 40 inserted" in out
    assert "columns: id bigint, source_file text, split text, sentiment text, rating bigint" in out
    assert column_types(conn, "imdb")["rating"] == "bigint"
    models.add(conn, models.AddRequest("imdb_minilm", "imdb", "text", precision="fp32"))
    stats = worker.Worker(db_url, worker.Options(models=("imdb_minilm",), once=True)).run()
    assert stats.written == 40
    want = {key for (key,) in conn.execute("SELECT id FROM imdb WHERE rating >= 7")}
    assert len(want) == 20 and 10 in {r for (r,) in conn.execute("SELECT rating FROM imdb")}
    with pgembed.Client(db_url) as client:
        hits = client.search("imdb_minilm", "a great film", k=40, filter={"rating": {"$gte": 7}})
    assert {hit.key for hit in hits} == want  # "10" >= "7" is false as text: 10 >= 7 here


def test_types_are_inferred_from_every_value(
    conn: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "things.csv"
    path.write_text(
        "id,code,score,ok,day,at,local,mixed,empty\n"
        "1,02134,7,true,2024-01-02,2024-01-02T03:04:05Z,2024-01-02 03:04:05,1,\n"
        "2,10001,0.5,FALSE,2024-02-01,2024-02-01 10:00:00+05:30,2024-02-01T10:00,x,\n"
        "3,,-1e3,,,,,2,\n"
    )
    code, out = load(db_url, str(path), "--table", "things")
    assert code == 0, out
    assert column_types(conn, "things") == {
        "id": "bigint",
        "code": "text",  # a leading zero: a code, not a number
        "score": "double precision",  # integers and decimals together
        "ok": "boolean",
        "day": "date",
        "at": "timestamp with time zone",
        "local": "timestamp without time zone",
        "mixed": "text",
        "empty": "text",  # no value at all
    }
    conn.execute("SET TimeZone = 'UTC'")
    row = conn.execute(
        "SELECT code, score, ok, day::text, at::text, local::text FROM things WHERE id = 2"
    ).fetchone()
    assert row == (
        "10001",
        0.5,
        False,
        "2024-02-01",
        "2024-02-01 04:30:00+00",
        "2024-02-01 10:00:00",
    )
    assert conn.execute("SELECT score, ok, day FROM things WHERE id = 3").fetchone() == (
        -1000.0,
        None,
        None,
    )


def test_json_numbers_and_booleans_keep_their_type_but_quoted_strings_stay_text(
    conn: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "docs.jsonl"
    records = [
        {"_id": "1", "n": 7, "f": 0.5, "ok": True, "when": "2024-01-02T03:04:05Z", "s": "7"},
        {"_id": "2", "n": 10, "f": 2, "ok": False, "when": None, "s": "8"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out = load(db_url, str(path), "--table", "docs")
    assert code == 0, out
    assert column_types(conn, "docs") == {
        "_id": "text",
        "n": "bigint",
        "f": "double precision",
        "ok": "boolean",
        "when": "timestamp with time zone",
        "s": "text",
    }
    assert conn.execute("SELECT _id FROM docs WHERE n >= 8").fetchall() == [("2",)]


def test_types_option(conn: psycopg.Connection, db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "codes.csv"
    path.write_text("id,code,score\n1,007,3\n2,042,4\n")
    code, out = load(db_url, str(path), "--table", "codes", "--types", "code=int, score=float")
    assert code == 0, out
    assert column_types(conn, "codes") == {
        "id": "bigint",
        "code": "bigint",
        "score": "double precision",
    }
    assert conn.execute("SELECT code, score FROM codes ORDER BY id").fetchall() == [
        (7, 3.0),
        (42, 4.0),
    ]
    # A re-load into the existing table with the same --types is fine; another type is not.
    code, out = load(db_url, str(path), "--table", "codes", "--types", "code=int")
    assert code == 0 and "0 inserted, 2 skipped" in out, out
    code, out = load(db_url, str(path), "--table", "codes", "--types", "code=text")
    assert code == 2 and "has it as bigint" in out, out
    bad = tmp_path / "bad.csv"
    bad.write_text("id,score\n1,3\n2,high\n")
    code, out = load(db_url, str(bad), "--table", "bad", "--types", "score=float")
    assert code == 2 and "bad.csv:3: score = 'high' is not a double precision" in out, out
    code, out = load(db_url, str(bad), "--table", "bad", "--types", "score=decimal")
    assert code == 2 and "--types 'score=decimal'" in out and "timestamptz" in out, out
    code, out = load(db_url, str(bad), "--table", "bad", "--types", "nope=int")
    assert code == 1 and "'nope'" in out, out
    assert conn.execute("SELECT to_regclass('public.bad')").fetchone() == (None,)


def test_invalid_utf8_and_cut_gzip_are_one_line_and_load_nothing(
    conn: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(b"id,body\n1,fine\n2,caf\xe9 au lait\n3,fine too\n")
    code, out = load(db_url, str(bad), "--table", "t")
    assert code == 2, out
    assert len(out.strip().splitlines()) == 1, out
    assert f"{bad}:3: not valid UTF-8 at byte offset 20 (b'\\xe9')" in out, out
    assert conn.execute("SELECT to_regclass('public.t')").fetchone() == (None,)
    # Into an existing table: the rows before the bad line are rolled back with it.
    conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, body text)")
    code, out = load(db_url, str(bad), "--table", "t")
    assert code == 2 and "latin1.csv:3: not valid UTF-8" in out, out
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)

    whole = gzip.compress(IMDB.read_bytes())
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    conn.execute(
        "CREATE TABLE t2 (id bigint PRIMARY KEY, source_file text, split text, sentiment text, "
        "rating bigint, movie_url text, text text)"
    )
    for table in ("imdb", "t2"):  # a new table, then an existing one
        code, out = load(db_url, str(cut), "--table", table)
        assert code == 2, out
        assert len(out.strip().splitlines()) == 1, out
        assert "cut.csv.gz: the gzip data is truncated or corrupt" in out, out
        assert "Aborted" not in out and "Traceback" not in out
    assert conn.execute("SELECT to_regclass('public.imdb')").fetchone() == (None,)
    assert conn.execute("SELECT count(*) FROM t2").fetchone() == (0,)
    # The same excerpt, whole: loads (a BOM in front is skipped).
    ok = tmp_path / "ok.csv"
    with ok.open("wb") as f:
        f.write(b"\xef\xbb\xbf")
        with IMDB.open("rb") as source:
            shutil.copyfileobj(source, f)
    code, out = load(db_url, str(ok), "--table", "imdb")
    assert code == 0 and "40 inserted" in out, out
