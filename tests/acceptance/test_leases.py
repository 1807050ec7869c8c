"""Leases on a slow machine: a worker pinned to one core, long texts, batches that outlast a
2 s lease (short to keep the test short; any lease behaves the same). A live worker keeps its
batches (in hand and prefetched) leased, so no key is embedded twice; a killed worker renews
nothing, so its keys come back after the lease."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Iterator

import psycopg
import pytest

from daemon_helpers import wait_for
from helpers import run_cli_here
from pgembed import db
from pgembed.lifecycle import models

LEASE = 1  # the shortest `sync` takes
# Two batches of 70 texts of 256 word pieces: 1.8-3.3 s each on one idle core of an AMX Xeon
# (1.8 s did not outlast the 2 s lease this test had before), 6-13 s on slower ones.
ROWS = 140
SLOW = ["--lease-seconds", str(LEASE), "--claim-size", str(ROWS // 2)]


def insert(conn: psycopg.Connection, n: int, start: int = 0) -> None:
    """Generated texts of 300 made-up words: each fills MiniLM's 256 word pieces."""
    rng = random.Random(start)
    words = ["".join(rng.choices("aeioubcdfglmnprst", k=rng.randint(3, 9))) for _ in range(500)]
    texts = [" ".join(rng.choices(words, k=300)) for _ in range(n)]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO essays VALUES (%s, %s)", enumerate(texts, start))


@pytest.fixture
def app(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE essays (id integer PRIMARY KEY, body text)")
        insert(conn, ROWS)
        with db.connection(db_url) as pinned:
            models.add(pinned, models.AddRequest("minilm", "essays", "body", precision="fp32"))
        yield conn


def pinned_sync(db_url: str, *args: str) -> list[str]:
    """`pgembed sync` on one core: the slow machine."""
    return ["taskset", "-c", "0", sys.executable, "-m", "pgembed", "--database-url", db_url,
            "sync", *args]  # fmt: skip


def embedded(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(embedding_minilm) FROM essays").fetchone()
    return int(row[0]) if row else 0


def batches(conn: psycopg.Connection) -> tuple[int, float]:
    """Rows written (summed over batches) and the slowest batch's seconds."""
    row = conn.execute("SELECT sum(rows), max(seconds) FROM pgembed.batches").fetchone()
    return (int(row[0]), float(row[1])) if row and row[0] is not None else (0, 0.0)


def queued(conn: psycopg.Connection, where: str = "true") -> int:
    row = conn.execute(f"SELECT count(*) FROM pgembed.queue WHERE {where}").fetchone()
    return int(row[0]) if row else 0


def test_slow_batches_are_embedded_once_and_a_killed_workers_come_back(
    app: psycopg.Connection, db_url: str
) -> None:
    # The batch in hand and the prefetched one both outlast the lease: with nothing renewed,
    # the prefetched keys would be claimed again once the first batch is written (150 written).
    once = subprocess.run(pinned_sync(db_url, "--once", *SLOW), capture_output=True, text=True)
    assert f"synced: {ROWS} written, 0 skipped, 0 failed" in once.stdout, once.stderr
    written, slowest = batches(app)
    assert written == ROWS  # nothing written twice
    assert slowest > LEASE  # a batch outlived its lease: the case this test is about

    insert(app, ROWS, start=ROWS)
    proc = subprocess.Popen(pinned_sync(db_url, *SLOW), stderr=subprocess.DEVNULL)
    try:
        claimed = "claimed_by IS NOT NULL"
        wait_for(lambda: queued(app, claimed) == ROWS, 60, "a batch in hand, one prefetched")
        time.sleep(LEASE + 1)  # past the first lease: what is left is still held, renewed
        assert queued(app, f"{claimed} AND next_attempt_at > pg_catalog.now()") == queued(app)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    left = queued(app)
    assert left > 0
    # Nothing renews them now: the dead worker's keys are ready again within a lease.
    wait_for(
        lambda: queued(app, "next_attempt_at > pg_catalog.now()") == 0,
        LEASE + 2,
        "the dead worker's leases to run out",
    )
    done = run_cli_here("--database-url", db_url, "sync", "--once")  # no need of a process
    assert f"synced: {left} written, 0 skipped, 0 failed" in done.stdout, done.stderr
    assert embedded(app) == 2 * ROWS  # nothing lost
    assert batches(app)[0] == 2 * ROWS  # nothing written twice
