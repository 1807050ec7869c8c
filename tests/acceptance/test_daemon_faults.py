"""The daemon rides out server restarts at any moment (model load included) with a backoff that
starts over after each reconnect, and skips a model whose table is gone, saying so once."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import psycopg
import pytest

from daemon_helpers import embedded_count, fill, restart_server, start_sync, wait_for
from helpers import REVIEWS
from pgembed import db
from pgembed.lifecycle import models
from pgembed.sync.worker import Backoff

EXTERNAL = "PGEMBED_TEST_DATABASE_URL" in os.environ  # a server these tests cannot restart


@pytest.fixture
def app(db_url: str) -> Iterator[psycopg.Connection]:
    """The application's own session (its search_path): the 8 `reviews`, watched by `minilm`."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE reviews (id integer PRIMARY KEY, body text, stars integer)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO reviews (id, body, stars) VALUES (%s, %s, 3)", REVIEWS)
        watch(db_url, "minilm", "reviews")
        yield conn


def watch(db_url: str, name: str, table: str) -> None:
    # fp32: the vectors are those of the reference model on any CPU.
    with db.connection(db_url) as conn:
        models.add(conn, models.AddRequest(name, table, "body", precision="fp32"))


def alive(proc: subprocess.Popen[str]) -> bool:
    assert proc.poll() is None, proc.communicate()[1]
    return True


def catch_up(proc: subprocess.Popen[str], db_url: str, start: int) -> None:
    """After a restart: 10 new rows, and every row, are embedded by the same running daemon."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        fill(conn, 10, start=start)
        rows = conn.execute("SELECT count(*) FROM reviews").fetchone()
        wait_for(lambda: alive(proc) and (embedded_count(conn),) == rows, 90, "every row")


def loading_the_model(conn: psycopg.Connection) -> bool:
    """The daemon is connected and listening but has not said it is alive: its model loads."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE query LIKE 'LISTEN%%'), "
        "(SELECT count(*) FROM pgembed.workers) "
        "FROM pg_stat_activity WHERE application_name = 'pgembed' AND datname = current_database()"
    ).fetchone()
    return row is not None and row[0] > 0 and row[1] == 0


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_reconnect() -> None:
    backoff = Backoff(cap=4)
    assert [backoff.next() for _ in range(5)] == [0.5, 1, 2, 4, 4]
    assert backoff.reset() is True and backoff.reset() is False
    assert backoff.next() == 0.5


def test_restarts_during_model_load_and_between_batches(
    app: psycopg.Connection, db_url: str
) -> None:
    proc = start_sync(db_url, "--poll-seconds", "0.5")
    try:
        wait_for(lambda: loading_the_model(app), 60, "the daemon's first connections")
        restarted = [restart_server()]  # before the daemon's first heartbeat: during the load
        catch_up(proc, db_url, start=100)
        restarted.append(restart_server())  # later: idle between batches
        catch_up(proc, db_url, start=110)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert restarted == [not EXTERNAL] * 2
    if EXTERNAL:
        return
    lines = [
        line for line in stderr.splitlines() if "database fault" in line or "reconnected" in line
    ]
    assert sum("reconnected to the database" in line for line in lines) == 2, stderr
    # After each reconnect the backoff starts over: each outage's first wait is the shortest.
    pairs = zip(["reconnected", *lines], lines, strict=False)
    firsts = [line for before, line in pairs if "reconnected" in before and "fault" in line]
    assert len(firsts) == 2 and all("reconnecting in 0.5s" in line for line in firsts), lines


def test_a_dropped_table_is_said_once_and_the_other_models_go_on(
    app: psycopg.Connection, db_url: str
) -> None:
    reviews = app
    for table in ("gone", "notes"):
        reviews.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, body text)")
        reviews.execute(f"INSERT INTO {table} VALUES (1, 'fresh apples')")
        watch(db_url, table, table)
    reviews.execute("DROP TABLE gone")
    reviews.execute("ALTER TABLE notes RENAME COLUMN body TO content")
    proc = start_sync(db_url, "--poll-seconds", "0.3", "--lease-seconds", "1")
    try:
        wait_for(lambda: embedded_count(reviews) == 8, 60, "the initial rows")
        fill(reviews, 10)
        wait_for(lambda: embedded_count(reviews) == 18, 60, "rows inserted later")
        time.sleep(3)  # ten polls and three leases: time enough to repeat an error
        reviews.execute("ALTER TABLE notes RENAME COLUMN content TO body")  # mended
        wait_for(
            lambda: reviews.execute("SELECT count(embedding_notes) FROM notes").fetchone() == (1,),
            30,
            "the mended model's row",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    gone = [line for line in stderr.splitlines() if "model=gone" in line]
    assert len(gone) == 1 and "table public.gone no longer exists" in gone[0], stderr
    notes = [line for line in stderr.splitlines() if "model=notes" in line and "rows=" not in line]
    assert len(notes) == 2, stderr
    assert "has no column 'body'" in notes[0] and "serving it" in notes[1]
    assert "batch failed" not in stderr and "Traceback" not in stderr
