"""What the real executable prints: one JSON log line per batch, `status --watch` redrawing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psycopg

from pgembed.lifecycle import models


def test_json_logs_one_line_per_batch(reviews: psycopg.Connection, db_url: str) -> None:
    models.add(reviews, models.AddRequest("minilm", "reviews", "body", precision="fp32"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pgembed",
            "--database-url",
            db_url,
            "sync",
            "--once",
            "--claim-size",
            "3",
            "--log-format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    batches = [r for r in records if "rows_per_second=" in r["message"]]
    assert len(batches) == 3  # 8 rows in batches of 3
    assert all(r["level"] == "info" and r["logger"] == "pgembed.sync" for r in batches)


def test_status_watch_refreshes(reviews: psycopg.Connection, db_url: str) -> None:
    models.add(reviews, models.AddRequest("minilm", "reviews", "body", precision="fp32"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgembed",
            "--database-url",
            db_url,
            "status",
            "--watch",
            "--interval",
            "0.3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3)
    proc.send_signal(signal.SIGINT)  # Ctrl-C: how a watch ends, not an error
    out, err = proc.communicate(timeout=10)
    assert out.count("minilm: all-MiniLM-L6-v2") >= 2
    assert proc.returncode == 0 and err == ""
