"""The sync daemon as real processes: kills, restarts, many workers, in-flight updates, shutdown."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from daemon_helpers import (
    assert_every_vector_matches_its_text,
    embedded_count,
    fill,
    restart_server,
    start_sync,
    wait_for,
)
from helpers import cli, make_due, with_database
from pgembed.catalog import registry
from pgembed.lifecycle import models


@pytest.fixture
def watched(reviews: psycopg.Connection) -> psycopg.Connection:
    # fp32: the end state is checked against fp32 vectors, on any CPU.
    models.add(reviews, models.AddRequest("minilm", "reviews", "body", precision="fp32"))
    return reviews


def test_updates_never_wait_for_a_batch_in_flight(watched: psycopg.Connection, db_url: str) -> None:
    fill(watched, 400)
    proc = start_sync(db_url, "--claim-size", "32", "--poll-seconds", "0.5")
    try:
        wait_for(lambda: embedded_count(watched) > 0, 60, "the first batch")
        # Any wait longer than a write-back transaction (milliseconds) fails the UPDATE.
        watched.execute("SET lock_timeout = '2s'")
        rng = random.Random(7)
        for i in rng.sample(range(100, 500), 60):
            watched.execute("UPDATE reviews SET body = %s WHERE id = %s", (f"edited {i}", i))
        wait_for(
            lambda: (
                watched.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
                and embedded_count(watched) == 408
            ),
            120,
            "the queue to drain",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert_every_vector_matches_its_text(watched)


def test_sigkill_at_any_point_loses_nothing(watched: psycopg.Connection, db_url: str) -> None:
    fill(watched, 300)
    rng = random.Random(11)
    for round_ in range(3):
        proc = start_sync(db_url, "--claim-size", "16", "--lease-seconds", "2")
        before = embedded_count(watched)
        wait_for(lambda b=before: embedded_count(watched) > b, 60, "progress")  # type: ignore[misc]
        time.sleep(rng.uniform(0.0, 0.6))  # somewhere in claim / embed / write
        proc.kill()
        proc.communicate(timeout=10)
        # The application keeps writing between crashes.
        for i in rng.sample(range(100, 400), 10):
            watched.execute(
                "UPDATE reviews SET body = %s WHERE id = %s", (f"round {round_} {i}", i)
            )
    make_due(watched)  # the dead workers' leases over (test_leases waits one out for real)
    result = cli("--database-url", db_url, "sync", "--once")
    assert result.exit_code == 0, result.output
    assert_every_vector_matches_its_text(watched)


def test_three_workers_split_the_work_without_embedding_a_row_twice(
    watched: psycopg.Connection, db_url: str
) -> None:
    fill(watched, 592)  # 600 rows with the 8 of the fixture
    workers = [start_sync(db_url, "--claim-size", "16", "--poll-seconds", "0.5") for _ in range(3)]
    try:
        wait_for(lambda: embedded_count(watched) == 600, 180, "all rows embedded")
        status = json.loads(cli("--database-url", db_url, "status", "--json").output)[0]
        assert len(status["workers"]) == 3
        assert {w["pid"] for w in status["workers"]} == {p.pid for p in workers}
        assert status["rows_per_second"] > 0
    finally:
        for p in workers:
            p.send_signal(signal.SIGTERM)
        for p in workers:
            p.communicate(timeout=30)
    assert [p.returncode for p in workers] == [0, 0, 0]
    written, batches_by = watched.execute(
        "SELECT sum(rows), count(DISTINCT worker_id) FROM pgembed.batches"
    ).fetchone() or (None, None)
    assert written == 600  # every row written exactly once
    assert batches_by >= 2
    assert_every_vector_matches_its_text(watched)


def test_worker_survives_dropped_connections_and_a_server_restart(
    watched: psycopg.Connection, db_url: str
) -> None:
    proc = start_sync(db_url, "--poll-seconds", "0.5")
    try:
        wait_for(lambda: embedded_count(watched) == 8, 60, "the initial rows")
        watched.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'pgembed' AND datname = current_database() "
            "AND pid <> pg_backend_pid()"  # not the daemons of tests beside it on a shared server
        )
        fill(watched, 20)
        wait_for(lambda: embedded_count(watched) == 28, 60, "rows after the dropped connection")
        restarted = restart_server()
        with psycopg.connect(db_url, autocommit=True) as conn:
            fill(conn, 20, start=200)
            wait_for(lambda: embedded_count(conn) == 48, 90, "rows after the restart")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "database fault" in stderr and "reconnected to the database" in stderr
    # Against an external server ($PGEMBED_TEST_DATABASE_URL) only the dropped connections apply.
    assert restarted == ("PGEMBED_TEST_DATABASE_URL" not in os.environ)


def test_worker_exits_on_faults_that_will_not_heal(
    watched: psycopg.Connection, db_url: str, empty_db_url: str
) -> None:
    no_schema = cli("--database-url", empty_db_url, "sync", "--once")
    assert no_schema.exit_code == 1 and "run `pgembed migrate`" in no_schema.output
    missing = cli("--database-url", with_database(db_url, "no_such_database"), "sync")
    assert missing.exit_code == 1 and "does not exist" in missing.output
    # The schema disappears under a running daemon: it says so and exits 1.
    proc = start_sync(db_url, "--poll-seconds", "0.3")
    wait_for(lambda: embedded_count(watched) == 8, 60, "the initial rows")
    watched.execute("DROP SCHEMA pgembed CASCADE")
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert stderr.strip().splitlines()[-1] == (
        "pgembed: error: the pgembed schema is not installed: run `pgembed migrate`"
    )


def test_sigterm_mid_batch_finishes_the_batch_and_exits_zero(
    watched: psycopg.Connection, db_url: str
) -> None:
    fill(watched, 600)
    proc = start_sync(db_url, "--claim-size", "200")
    # 400 claimed: the next batch is prefetched, so the first one is past its last chance to be
    # handed back unstarted (the worker checks for a stop just before it prefetches).
    wait_for(
        lambda: (
            watched.execute(
                "SELECT count(*) >= 400 FROM pgembed.queue WHERE claimed_by IS NOT NULL"
            ).fetchone()
            == (True,)
        ),
        60,
        "a full batch in flight",
    )
    stopped = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert time.monotonic() - stopped < 30
    # Nothing is left leased to the dead worker: its batch was written (or handed back).
    assert watched.execute(
        "SELECT count(*) FROM pgembed.queue WHERE next_attempt_at > now()"
    ).fetchone() == (0,)
    # The batch in hand was written; a prefetched one was handed back: every row is accounted for.
    waiting = watched.execute(
        "SELECT count(*) FROM (SELECT key FROM pgembed.queue UNION SELECT key FROM pgembed.inbox) k"
    ).fetchone()
    assert embedded_count(watched) >= 200
    assert embedded_count(watched) + (waiting[0] if waiting else 0) == 608
    assert watched.execute("SELECT count(*) FROM pgembed.workers").fetchone() == (0,)


def test_a_model_added_while_a_backlog_drains_is_served_at_once(
    watched: psycopg.Connection, db_url: str
) -> None:
    fill(watched, 1200)  # ~20 s of work for minilm at ~60 rows/s
    proc = start_sync(db_url, "--claim-size", "16", "--poll-seconds", "30")
    try:
        wait_for(lambda: embedded_count(watched) > 0, 60, "the first batch")
        watched.execute("CREATE TABLE notes (id integer PRIMARY KEY, body text)")
        watched.execute("INSERT INTO notes VALUES (1, 'the battery is weak'), (2, 'fresh apples')")
        models.add(watched, models.AddRequest("notes", "notes", "body", precision="fp32"))
        # The daemon reads the new model's NOTIFY between two batches of the backlog, rereads
        # the catalog and serves both, instead of finishing minilm's backlog first.
        wait_for(
            lambda: watched.execute("SELECT count(embedding_notes) FROM notes").fetchone() == (2,),
            30,
            "the new model's rows",
        )
        assert embedded_count(watched) < 1208  # minilm's backlog was not finished first
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


def test_daemon_wakes_on_notify_and_exits_zero_on_sigterm(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgembed", "--database-url", db_url, "sync", "--poll-seconds", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            done = reviews.execute("SELECT count(embedding_minilm) FROM reviews").fetchone()
            if done == (8,):
                break
            time.sleep(0.2)
        assert done == (8,)
        # With a 60 s poll, only the NOTIFY can make this insert searchable quickly.
        reviews.execute("INSERT INTO reviews VALUES (70, 'woken by notify', 1)")
        inserted = time.monotonic()
        while time.monotonic() - inserted < 20:
            if reviews.execute(
                "SELECT embedding_minilm IS NOT NULL FROM reviews WHERE id = 70"
            ).fetchone() == (True,):
                break
            time.sleep(0.1)
        assert time.monotonic() - inserted < 20
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "rows_per_second=" in stderr  # one INFO line per batch
