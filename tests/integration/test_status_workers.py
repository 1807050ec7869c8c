"""`pgembed status` says when rows wait and no live worker serves their model, and since when a
worker was last seen (issue 50): by its last heartbeat, or the model's last batch, else that
none is on record. A connected worker silences it, however many rows wait."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg

from daemon_helpers import wait_for
from helpers import REVIEWS, cli
from pgembed.catalog.registry import ModelSpec
from pgembed.lifecycle import status
from pgembed.sync import store, worker

NO_WORKER = "no sync worker is running"


def minilm(db_url: str) -> tuple[str, dict[str, Any]]:
    """The text lines of model minilm in `status`, and its entry in `status --json`."""
    text = cli("--database-url", db_url, "status")
    assert text.exit_code == 0, text.output
    printed = cli("--database-url", db_url, "status", "--json")
    assert printed.exit_code == 0, printed.output
    [entry] = [m for m in json.loads(printed.output) if m["name"] == "minilm"]
    return text.output, entry


def test_rows_queued_and_no_worker_say_since_when_one_was_seen(
    spec: ModelSpec, conn: psycopg.Connection, db_url: str
) -> None:
    # Never a worker: nothing on record, and the rows wait.
    text, entry = minilm(db_url)
    n = len(REVIEWS)
    assert f"  {NO_WORKER}: {n} rows queued, no worker on record, rows waiting up to " in text
    assert "; start one: `pgembed sync`" in text
    assert entry["workers"] == []
    assert entry["no_live_worker"] == {
        "last_seen": None,
        "last_seen_seconds": None,
        "last_seen_by": None,
    }

    # A worker embedded them, then stopped cleanly (its heartbeat row goes with it): its last
    # batch, 21 minutes ago, is the trace left; new rows wait since.
    assert worker.Worker(db_url, worker.Options(once=True)).run().written == n
    conn.execute("UPDATE pgembed.batches SET finished_at = now() - interval '21 minutes'")
    conn.execute("UPDATE reviews SET body = body || ' (edited)' WHERE id <= 3")
    text, entry = minilm(db_url)
    assert f"  {NO_WORKER}: 3 rows queued, a worker last seen 21 min ago (its last batch " in text
    assert entry["no_live_worker"]["last_seen_by"] == "batch"
    assert 21 * 60 <= entry["no_live_worker"]["last_seen_seconds"] < 22 * 60

    # A worker killed 3 minutes ago (no clean exit: its row stays, its session is gone), newer
    # than the batch: its heartbeat is the last sign of life.
    conn.execute(
        "INSERT INTO pgembed.workers (id, host, pid, models, heartbeat_at) VALUES "
        "('gone-host:4242:deadbeef', 'gone-host', 4242, ARRAY['minilm'], "
        "now() - interval '3 minutes')"
    )
    text, entry = minilm(db_url)
    assert f"  {NO_WORKER}: 3 rows queued, a worker last seen 3 min ago (its last heartbeat)" in (
        text
    )
    assert entry["no_live_worker"]["last_seen_by"] == "heartbeat"
    assert entry["no_live_worker"]["last_seen"] is not None

    # No rows waiting: nothing to say, worker or not.
    assert worker.Worker(db_url, worker.Options(once=True)).run().written == 3
    text, entry = minilm(db_url)
    assert NO_WORKER not in text
    assert entry["queued"] == 0 and entry["no_live_worker"] is None


def test_a_connected_worker_is_no_missing_one(
    spec: ModelSpec, conn: psycopg.Connection, db_url: str
) -> None:
    """A live daemon, its rows still queued (held back until a retry an hour away, as after a
    failure): status counts it and says nothing of a missing worker."""
    store.transfer(conn, "minilm")
    conn.execute("UPDATE pgembed.queue SET next_attempt_at = now() + interval '1 hour'")
    daemon = worker.Worker(db_url, worker.Options(models=("minilm",)))
    thread = threading.Thread(target=daemon.run)
    thread.start()
    try:
        wait_for(lambda: status.model_status(conn, spec)["workers"] != [], 60, "the worker")
        text, entry = minilm(db_url)
        assert entry["queued"] == len(REVIEWS) and len(entry["workers"]) == 1
        assert entry["no_live_worker"] is None
        assert NO_WORKER not in text and "workers 1" in text
    finally:
        daemon.stop()
        thread.join(30)
    assert not thread.is_alive()
    # Stopped cleanly: its heartbeat is gone and it wrote no batch, so none is on record.
    text, entry = minilm(db_url)
    assert f"  {NO_WORKER}: {len(REVIEWS)} rows queued, no worker on record" in text
