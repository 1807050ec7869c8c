"""The embedded default, exercised as a user would: separate processes, no URL anywhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from helpers import run_cli

SETUP = """
from pgembed import db, locate
with db.connection(locate.resolve_url()) as conn:
    conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text)")
    conn.execute("INSERT INTO notes VALUES (1, 'the battery drains overnight'), "
                 "(2, 'lovely crisp apples'), (3, 'the charger overheats')")
"""


def postmaster_pid(home: Path) -> int | None:
    pidfile = home / "pgdata" / "postmaster.pid"
    if not pidfile.exists():
        return None
    pid = int(pidfile.read_text().split()[0])
    return pid if psutil.pid_exists(pid) else None


def test_processes_share_one_embedded_server_and_data_persists(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "PGEMBED_HOME": str(home)}
    env.pop("PGEMBED_DATABASE_URL", None)
    env.pop("DATABASE_URL", None)

    def run(*a: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*a, env=env)

    assert run("migrate").returncode == 0
    assert postmaster_pid(home) is None  # the last holder exited, so the server stopped
    subprocess.run([sys.executable, "-c", SETUP], env=env, check=True, timeout=60)
    added = run(
        "model", "add", "notes", "--table", "notes", "--column", "body", "--precision", "fp32"
    )
    assert added.returncode == 0, added.stderr

    daemon = subprocess.Popen(
        [sys.executable, "-m", "pgembed", "sync", "--poll-seconds", "0.5"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        embedded = 0
        deadline = time.monotonic() + 90
        while embedded < 3 and time.monotonic() < deadline:
            time.sleep(0.5)
            status = run("status", "--json")
            assert status.returncode == 0, status.stderr
            embedded = json.loads(status.stdout)[0]["rows_embedded"]
        hits = run("query", "battery drained by morning", "--model", "notes", "-k", "1").stdout
        assert hits.startswith("1\t")
        server = postmaster_pid(home)
        assert server is not None  # still up: the daemon holds it
        assert run("status").returncode == 0
        assert postmaster_pid(home) == server  # the query and status joined the same server
        daemon.send_signal(signal.SIGTERM)
        _, stderr = daemon.communicate(timeout=30)
        assert daemon.returncode == 0, stderr
    finally:
        daemon.kill()
    deadline = time.monotonic() + 15
    while postmaster_pid(home) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert postmaster_pid(home) is None
    # Data persisted across the restart of the server.
    again = run("query", "fruit", "--model", "notes", "-k", "1")
    assert again.returncode == 0 and again.stdout.startswith("2\t"), again.stderr
