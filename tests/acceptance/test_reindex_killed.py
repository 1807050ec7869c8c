"""A reindex killed half-way (SIGKILL of the real process) resumes where it stopped."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from helpers import cli, make_due
from pgembed.lifecycle import models
from pgembed.sync import worker
from reindex_helpers import TEXTS, assert_vectors, make_table


@pytest.fixture
def many(conn: psycopg.Connection, db_url: str) -> None:
    """120 short rows embedded by `minilm`: enough for a reindex to be caught half-way."""
    texts = {i: f"Row {i}: {TEXTS[i % 40 + 1]}" for i in range(1, 121)}
    make_table(conn, texts)
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    worker.Worker(db_url, worker.Options(once=True, claim_size=64)).run()


def test_killed_reindex_resumes_and_status_shows_it(
    many: None, conn: psycopg.Connection, db_url: str
) -> None:
    args = ["--database-url", db_url, "model", "alter", "minilm", "--pooling", "max"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgembed", *args, "--claim-size", "2", "--lease-seconds", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        embedded = 0
        while embedded < 10 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
            try:
                row = conn.execute("SELECT count(embedding_minilm__next) FROM docs").fetchone()
                embedded = row[0] if row else 0
            except psycopg.errors.UndefinedColumn:
                pass
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate(timeout=30)  # reaps it and closes the pipes
    (status,) = json.loads(cli("--database-url", db_url, "status", "--json").output)
    progress = status["reindex"]
    assert progress["version"] == 2 and progress["pooling"] == "max"
    assert 10 <= progress["rows_embedded"] < progress["rows_total"] == 120
    assert progress["queued"] == 120 - progress["rows_embedded"]
    assert status["rows_embedded"] == 120 and status["pooling"] == "mean"  # still serving v1
    text = cli("--database-url", db_url, "status").output
    assert (
        "reindex to version 2 in progress" in text
        and f"embedded {progress['rows_embedded']}/120" in text
    )

    # The rerun picks up the shadow with its queue, the killed run's lease over.
    make_due(conn)
    again = cli("--database-url", db_url, "reindex", "minilm", "--lease-seconds", "3")
    assert again.exit_code == 0, again.output
    assert "version 2" in again.output
    texts: dict[int, str] = dict(conn.execute("SELECT id, body FROM docs").fetchall())
    assert_vectors(conn, texts, pooling="max")
    (status,) = json.loads(cli("--database-url", db_url, "status", "--json").output)
    assert status["reindex"] is None and status["pooling"] == "max" and status["version"] == 2


def test_a_ctrl_c_during_a_backfill_says_so_at_once_and_loses_no_row(
    conn: psycopg.Connection, db_url: str
) -> None:
    """Ctrl-C says at once what it finishes (a second one would stop there and then), exits 130
    with the backfill's line, and every row stays embedded or queued."""
    texts = {i: f"Row {i}: " + " ".join([TEXTS[i % 40 + 1]] * 4) for i in range(1, 1201)}
    make_table(conn, texts)
    args = ["--database-url", db_url, "model", "add", "bf", "--table", "docs", "--column", "body"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgembed", *args, "--precision", "fp32", "--backfill"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        claimed = 0
        while not claimed and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            row = conn.execute(
                "SELECT count(*) FROM pgembed.queue WHERE model = 'bf' AND claimed_by IS NOT NULL"
            ).fetchone()
            claimed = row[0] if row else 0
        assert claimed and proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "stopping after the batch in hand, or cancelling the index build (Ctrl-C again" in err
    assert err.strip().splitlines()[-1].startswith("pgembed: backfill of bf stopped")
    lost = conn.execute(
        "SELECT count(*) FROM docs d WHERE embedding_bf IS NULL AND NOT EXISTS (SELECT 1 "
        "FROM pgembed.queue q WHERE q.model = 'bf' AND q.key = d.id::text)"
    ).fetchone()
    assert lost == (0,)
