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
    assert status["rows_total"] == 4  # the NULL and blank rows have no text to embed
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


# Texts that show nothing: each alone, and all of them with white space.
INVISIBLE = [
    "\u2060",  # word joiner
    "\u200c",  # zero-width non-joiner
    "\u200d",  # zero-width joiner
    "\u00ad",  # soft hyphen
    "\u2800",  # Braille blank
    "\u3164",  # Hangul filler
    "\u200b",  # zero-width space
    "\u200e\u200f",  # left-to-right and right-to-left marks
    "\u202e",  # right-to-left override
    "\u2066\u2069",  # isolates
    "\ufeff",  # byte-order mark
    "\u115f\u1160\uffa0",  # Hangul choseong and jungseong fillers, halfwidth filler
    "\u034f",  # combining grapheme joiner
    "\ufe0f",  # variation selector 16
    "\U000e0041\U000e007f",  # tag characters
    "\u2061\u2062\u2063\u2064",  # invisible operators
    " \u2060\t\u200d\n\u00ad\u2800 \u3164",
]


def test_texts_that_show_nothing_are_blank(conn: psycopg.Connection, db_url: str) -> None:
    """Like white space: never queued, no vector; an embedded row updated to one loses its
    vector and is not queued again."""
    conn.execute("CREATE TABLE public.docs (id integer PRIMARY KEY, body text)")
    rows = [(i, text) for i, text in enumerate(INVISIBLE)] + [(100, "A visible review.")]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO docs VALUES (%s, %s)", rows)
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (1,)
    with conn.cursor() as cur:  # inserted after `model add`: through the capture trigger
        cur.executemany("INSERT INTO docs VALUES (%s, %s)", [(i + 50, t) for i, t in rows[:-1]])
    result = pgembed.sync_once(database_url=db_url)
    assert (result.written, result.failed) == (1, 0)
    embedded = conn.execute("SELECT id FROM docs WHERE embedding_minilm IS NOT NULL")
    assert embedded.fetchall() == [(100,)]
    conn.execute("UPDATE docs SET body = %s WHERE id = 100", ("\u2060\u200d",))
    left = conn.execute(
        "SELECT (SELECT count(*) FROM pgembed.queue), (SELECT count(*) FROM pgembed.inbox), "
        "(SELECT count(embedding_minilm) FROM docs)"
    ).fetchone()
    assert left == (0, 0, 0)
    # Visible text beside invisible characters is text.
    conn.execute("UPDATE docs SET body = %s WHERE id = 100", ("\u2060soft\u00adware\u200d",))
    assert pgembed.sync_once(database_url=db_url).written == 1
