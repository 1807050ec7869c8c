"""f: insert-to-searchable latency with an idle daemon; h: application UPDATE latency while the
rows' batches are in flight. Both against a real `pgembed sync` process."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from bench.env import Database, median, percentile


@dataclass(frozen=True)
class Latency:
    samples: int
    p50_ms: float
    p95_ms: float
    p99_ms: float


def _summary(seconds: list[float]) -> Latency:
    ms = [s * 1000 for s in seconds]
    return Latency(len(ms), median(ms), percentile(ms, 95), percentile(ms, 99))


@contextmanager
def daemon(database: Database, *args: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgembed", "--database-url", database.url, "sync", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)


def _wait_idle(conn: psycopg.Connection, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() != (0,):
        if time.monotonic() > deadline:
            raise TimeoutError("the daemon did not drain the queue")
        time.sleep(0.05)


def _wait_listening(conn: psycopg.Connection, timeout: float = 120) -> None:
    """A worker's first heartbeat comes after its models are loaded, just before it listens."""
    deadline = time.monotonic() + timeout
    while conn.execute("SELECT count(*) FROM pgembed.workers").fetchone() == (0,):
        if time.monotonic() > deadline:
            raise TimeoutError("the daemon did not start")
        time.sleep(0.05)
    time.sleep(0.5)


def insert_to_searchable(database: Database, samples: int) -> Latency:
    """Commit an INSERT, then poll until the row has its vector (what a search would need)."""
    conn = database.connect()
    with daemon(database, "--poll-seconds", "5"):
        _wait_idle(conn)
        _wait_listening(conn)
        seconds = []
        for i in range(samples):
            key = 1_000_000 + i
            started = time.perf_counter()
            conn.execute(
                "INSERT INTO reviews (id, body) VALUES (%s, %s)",
                (key, f"a freshly written review number {i}, the battery is great"),
            )
            while conn.execute(
                "SELECT embedding_minilm IS NULL FROM reviews WHERE id = %s", (key,)
            ).fetchone() == (True,):
                time.sleep(0.002)
            seconds.append(time.perf_counter() - started)
            time.sleep(0.2)  # idle again between samples
    conn.close()
    return _summary(seconds)


def update_while_in_flight(database: Database, samples: int) -> Latency:
    """Time application UPDATEs of rows whose keys are claimed by a running worker."""
    conn = database.connect()
    conn.execute("UPDATE reviews SET body = body || ' (v2)'")  # queue every row again
    rng = random.Random(5)
    seconds = []
    with daemon(database, "--poll-seconds", "1"):
        deadline = time.monotonic() + 300
        while len(seconds) < samples and time.monotonic() < deadline:
            claimed = conn.execute(
                "SELECT key FROM pgembed.queue WHERE claimed_by IS NOT NULL LIMIT 50"
            ).fetchall()
            if not claimed:
                time.sleep(0.01)
                continue
            key = int(rng.choice(claimed)[0])
            started = time.perf_counter()
            conn.execute("UPDATE reviews SET body = body || '!' WHERE id = %s", (key,))
            seconds.append(time.perf_counter() - started)
            time.sleep(0.01)
        _wait_idle(conn)
    conn.close()
    return _summary(seconds)
