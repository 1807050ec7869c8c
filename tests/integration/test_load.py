"""`pgembed load`: JSON lines, CSV, gzip, BEIR corpora, re-loads and bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import psycopg

from helpers import cli
from pgembed import loader
from pgembed.lifecycle import models

BEIR: list[dict[str, object]] = [
    {"_id": "1", "title": "Aspirin", "text": "Aspirin thins the blood.", "metadata": {}},
    {"_id": "2", "title": "", "text": "No title here.", "metadata": {"year": 2020}},
    {"_id": "3", "title": "Only a title", "text": "", "metadata": {}},
]


def jsonl(records: list[dict[str, object]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def load(db_url: str, *args: str) -> tuple[int, str]:
    result = cli("--database-url", db_url, "load", *args)
    return result.exit_code, result.output


def test_beir_corpus_joins_title_and_text(
    conn: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "corpus.jsonl"
    path.write_text(jsonl(BEIR))
    code, out = load(db_url, str(path), "--table", "corpus", "--text-columns", "title,text")
    assert code == 0, out
    assert "created public.corpus: 3 records read, 3 inserted, 0 skipped" in out
    rows = conn.execute("SELECT _id, title, text, metadata FROM corpus ORDER BY _id").fetchall()
    assert rows == [
        ("1", "Aspirin", "Aspirin Aspirin thins the blood.", "{}"),
        ("2", "", "No title here.", '{"year": 2020}'),
        ("3", "Only a title", "Only a title", "{}"),
    ]
    assert [loader.joined(r, ("title", "text")) for r in BEIR] == [  # type: ignore[arg-type]
        (str(r["title"]) + " " + str(r["text"])).strip() for r in BEIR
    ]
    key = conn.execute(
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
        "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'corpus'::regclass AND i.indisprimary"
    ).fetchall()
    assert key == [("_id",)]


def test_gzip_is_read_by_suffix_or_magic_and_reload_skips_existing_keys(
    conn: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    gz = tmp_path / "corpus.jsonl.gz"
    gz.write_bytes(gzip.compress(jsonl(BEIR[:2]).encode()))
    code, out = load(db_url, str(gz), "--table", "corpus", "--text-columns", "title,text")
    assert code == 0 and "2 inserted" in out, out
    # No telling suffix: gzip by its magic bytes, JSON lines by its first character.
    odd = tmp_path / "corpus.data"
    odd.write_bytes(gzip.compress(jsonl(BEIR).encode()))
    code, out = load(db_url, str(odd), "--table", "corpus", "--text-columns", "title,text")
    assert code == 0, out
    assert "filled public.corpus: 3 records read, 1 inserted, 2 skipped" in out
    assert conn.execute("SELECT count(*) FROM corpus").fetchone() == (3,)


def test_csv_plain_and_gzip_fill_an_existing_watched_table(
    conn: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    conn.execute("CREATE TABLE reviews (id integer PRIMARY KEY, body text, stars integer)")
    models.add(conn, models.AddRequest("minilm", "reviews", "body", precision="fp32"))
    plain = tmp_path / "reviews.csv"
    plain.write_text('id,body,stars\n1,"Great, really great",5\n2,"Line one\nline two",\n')
    code, out = load(db_url, str(plain), "--table", "reviews")
    assert code == 0 and "2 inserted" in out, out
    packed = tmp_path / "more.csv.gz"
    packed.write_bytes(gzip.compress(b"id,body,stars\n3,Third one,1\n1,changed?,1\n"))
    code, out = load(db_url, str(packed), "--table", "reviews")
    assert code == 0 and "1 inserted, 1 skipped" in out, out
    rows = conn.execute("SELECT id, body, stars FROM reviews ORDER BY id").fetchall()
    assert rows == [
        (1, "Great, really great", 5),
        (2, "Line one\nline two", None),  # an empty CSV field is NULL
        (3, "Third one", 1),
    ]
    # New rows were captured for the watched model like any insert; skipped ones were not touched.
    queued = conn.execute(
        "SELECT key FROM pgembed.queue UNION SELECT key FROM pgembed.inbox ORDER BY key"
    ).fetchall()
    assert queued == [("1",), ("2",), ("3",)]


def test_bad_input_is_refused_with_one_line_and_loads_nothing(
    conn: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    good = tmp_path / "c.jsonl"
    good.write_text(jsonl(BEIR))
    code, out = load(db_url, str(good), "--table", "x; drop table y")
    assert code == 2 and "invalid table name" in out
    nokey = tmp_path / "nokey.jsonl"
    nokey.write_text(jsonl([{"name": "a"}]))
    code, out = load(db_url, str(nokey), "--table", "t")
    assert code == 2 and "--key" in out
    broken = tmp_path / "broken.jsonl"
    broken.write_text(jsonl(BEIR[:2]) + "{not json\n")
    code, out = load(db_url, str(broken), "--table", "t")
    assert code == 2 and "broken.jsonl:3: not JSON" in out
    extra = tmp_path / "extra.jsonl"
    extra.write_text(jsonl([*BEIR, {"_id": "9", "text": "x", "surprise": "y"}]))
    code, out = load(db_url, str(extra), "--table", "t")
    assert code == 2 and "'surprise' is not a column" in out
    hostile = tmp_path / "hostile.csv"
    hostile.write_text('id,"body""; drop table t; --"\n1,x\n')
    code, out = load(db_url, str(hostile), "--table", "t")
    assert code == 2 and "invalid column name" in out
    unclosed = tmp_path / "unclosed.csv"  # the last field's quote never closes
    unclosed.write_text('id,body\n1,"fine"\n2,"never closed\n3,swallowed\n')
    code, out = load(db_url, str(unclosed), "--table", "t")
    assert code == 2 and "unclosed.csv:3: not CSV: unexpected end of data" in out
    stray = tmp_path / "stray.csv"
    stray.write_text('id,body\n1,"quoted"then more\n')
    code, out = load(db_url, str(stray), "--table", "t")
    assert code == 2 and "stray.csv:2: not CSV: ',' expected after '\"'" in out
    nofield = tmp_path / "c2.jsonl"
    nofield.write_text(jsonl(BEIR))
    code, out = load(db_url, str(nofield), "--table", "t", "--text-columns", "abstract")
    assert code == 1 and "'abstract' is not a field" in out
    # Every failed load was one transaction: no table and no rows were left behind.
    assert conn.execute("SELECT to_regclass('public.t')").fetchone() == (None,)
    lines = out.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out
