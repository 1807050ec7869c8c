"""A model's table dropped under the worker: said once, with the reason; the other model goes on,
and `sync --once` does not count the dropped table's keys as waiting for a retry."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import psycopg
import pytest

from helpers import REVIEWS, cli
from pgembed import db
from pgembed.lifecycle import models
from pgembed.sync import worker


@pytest.fixture
def app(db_url: str) -> Iterator[psycopg.Connection]:
    """Tables `reviews` and `gone`, each watched by the model of its name."""
    with psycopg.connect(db_url, autocommit=True) as conn, db.connection(db_url) as pinned:
        for table in ("reviews", "gone"):
            conn.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, body text)")
            conn.cursor().executemany(f"INSERT INTO {table} VALUES (%s, %s)", REVIEWS)
            models.add(pinned, models.AddRequest(table, table, "body", precision="fp32"))
        yield conn


def test_a_table_dropped_under_a_drain_is_said_once(
    app: psycopg.Connection, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    w = worker.Worker(db_url, worker.Options(once=True))
    with db.connection(db_url) as conn:
        specs = w.models(conn)
        assert [s.name for s in specs] == ["gone", "reviews"]
        app.execute("DROP TABLE gone")  # after the catalog read, before the batch
        with caplog.at_level(logging.INFO, "pgembed.sync"):
            w.drain(conn, specs)  # gone's batch fails on the missing table; reviews goes on
            assert [s.name for s in w.models(conn)] == ["reviews"]  # rereading says nothing
    assert app.execute("SELECT count(embedding_reviews) FROM reviews").fetchone() == (8,)
    said = [r.getMessage() for r in caplog.records if "gone" in r.getMessage()]
    assert said == ["model=gone skipped: table public.gone no longer exists (dropped or renamed)"]


def test_sync_once_skips_a_dropped_table_and_counts_no_retries(
    app: psycopg.Connection, db_url: str
) -> None:
    app.execute("DROP TABLE gone")
    result = cli("--database-url", db_url, "sync", "--once")
    assert result.exit_code == 0, result.output
    assert "synced: 8 written, 0 skipped, 0 failed" in result.output
    assert "wait for a retry" not in result.output  # gone's 8 keys wait for their table
