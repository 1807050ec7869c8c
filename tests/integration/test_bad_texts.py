"""Texts real tables hold: each has one clear outcome, nothing stays queued, the worker goes on."""

from __future__ import annotations

import psycopg

import pgembed
from pgembed import defaults
from pgembed.lifecycle import models

TEXTS = {
    1: "A review of one megabyte. " * 40_000,  # ~1 MB: embedded from its start, marked truncated
    2: "Великолепно! 😀👍🏽 素晴らしい映画でした。 ממש סרט טוב. رائع جدا",  # emoji, CJK, RTL
    3: "x" * 50_000,  # one 50,000-character word: embedded (as [UNK]), marked truncated
    4: " \t\n\u00a0\u3000",  # white space only: never queued, no vector
    5: None,  # NULL: never queued, no vector
    6: "A short, ordinary review.",
}


def test_each_bad_text_has_one_clear_outcome(conn: psycopg.Connection, db_url: str) -> None:
    conn.execute("CREATE TABLE public.docs (id integer PRIMARY KEY, body text)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO docs VALUES (%s, %s)", list(TEXTS.items()))
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    result = pgembed.sync_once(database_url=db_url)
    assert (result.written, result.failed) == (4, 0)
    embedded = conn.execute("SELECT id FROM docs WHERE embedding_minilm IS NOT NULL ORDER BY id")
    assert [i for (i,) in embedded] == [1, 2, 3, 6]
    left = conn.execute(
        "SELECT (SELECT count(*) FROM pgembed.queue), (SELECT count(*) FROM pgembed.inbox), "
        "(SELECT count(*) FROM pgembed.failures)"
    ).fetchone()
    assert left == (0, 0, 0)
    truncated = conn.execute("SELECT key FROM pgembed.truncated ORDER BY key").fetchall()
    assert truncated == [("1",), ("3",)]
    (status,) = pgembed.status(database_url=db_url)
    assert (status["rows_embedded"], status["truncated"], status["queued"]) == (4, 2, 0)
    # The row of many scripts is found by its own words.
    with pgembed.Client(db_url) as client:
        assert client.search("minilm", "素晴らしい映画", k=1)[0].key == 2


def test_each_bad_text_has_one_clear_outcome_in_chunks(
    conn: psycopg.Connection, db_url: str
) -> None:
    """The same texts for a chunked model: the megabyte is embedded in MAX_WINDOWS windows and
    marked truncated past them; the 50,000-character word is one word piece, so one window."""
    conn.execute("CREATE TABLE public.docs (id integer PRIMARY KEY, body text)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO docs VALUES (%s, %s)", list(TEXTS.items()))
    request = models.AddRequest("minilm", "docs", "body", precision="fp32", long_texts="chunk")
    models.add(conn, request)
    result = pgembed.sync_once(database_url=db_url)
    assert (result.written, result.failed) == (4, 0)
    windows = conn.execute("SELECT key, count(*) FROM pgembed_minilm_chunks GROUP BY key")
    assert windows.fetchall() == [(1, defaults.MAX_WINDOWS - 1)]
    truncated = conn.execute("SELECT key FROM pgembed.truncated ORDER BY key").fetchall()
    assert truncated == [("1",)]
    (status,) = pgembed.status(database_url=db_url)
    assert (status["rows_embedded"], status["chunks"]) == (4, defaults.MAX_WINDOWS - 1)
