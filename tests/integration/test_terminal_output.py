"""Text from the database reaches the terminal inert: a row's text in `pgembed query`, a
failure's error in `pgembed status`, never an escape sequence the terminal would obey."""

from __future__ import annotations

import psycopg

from helpers import cli
from pgembed.catalog import registry

# An OSC that retitles the terminal, a CSI that clears it, an 8-bit CSI and a bidi override.
HOSTILE = "\x1b]0;owned\x07battery \x1b[2Jdied \x9b31m fast \u202eevil"


def assert_inert(output: str) -> None:
    assert not any(ch in output for ch in "\x1b\x07\x9b\u202e"), repr(output)
    assert "\\x1b]0;owned\\x07" in output and "\\u202e" in output


def test_query_prints_row_text_inert(
    reviews: psycopg.Connection, spec: registry.ModelSpec, db_url: str
) -> None:
    reviews.execute("INSERT INTO reviews VALUES (77, %s, 1)", (HOSTILE,))
    assert cli("--database-url", db_url, "sync", "--once").exit_code == 0
    result = cli("--database-url", db_url, "query", "--model", "minilm", "battery died fast")
    assert result.exit_code == 0, result.output
    assert_inert(result.output)


def test_status_prints_failure_errors_inert(
    reviews: psycopg.Connection, spec: registry.ModelSpec, db_url: str
) -> None:
    reviews.execute(
        "INSERT INTO pgembed.failures (model, key, attempts, error) VALUES ('minilm', %s, 3, %s)",
        ("1\x1b[H", f"model said: {HOSTILE}\nsecond line"),
    )
    result = cli("--database-url", db_url, "status")
    assert result.exit_code == 0, result.output
    assert_inert(result.output)
    assert "key=1\\x1b[H" in result.output
    # A failure is one line of the report: its own newline cannot forge another.
    assert "fast \\u202eevil\\x0asecond line" in result.output
