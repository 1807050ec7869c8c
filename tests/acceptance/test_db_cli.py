"""`pgembed db ...` as a user runs it: real processes, a real embedded server in a PGEMBED_HOME
of the test's own, no URL in the environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from daemon_helpers import wait_for
from pgembed.embedded import wheel
from pgembed.embedded.holders import HOLDER_PID_FILE, is_alive

UNREACHABLE = "postgresql://bob:hunter2@127.0.0.1:1/x"


def run(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real executable, with PGEMBED_HOME=home and neither URL variable set."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGEMBED_DATABASE_URL", "DATABASE_URL")}
    env["PGEMBED_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "pgembed", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@contextmanager
def watching(home: Path) -> Iterator[subprocess.Popen[str]]:
    """`pgembed status --watch` running (a holder of the embedded server); killed on the way out."""
    env = {k: v for k, v in os.environ.items() if k not in ("PGEMBED_DATABASE_URL", "DATABASE_URL")}
    env["PGEMBED_HOME"] = str(home)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pgembed", "status", "--watch", "--interval", "0.5"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        yield proc
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def postmaster_pid(home: Path) -> int | None:
    """The running server's pid, from postmaster.pid; None when it is not running."""
    try:
        pid = int((home / "pgdata" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if is_alive(pid) else None


def holders(home: Path) -> list[int]:
    return wheel.holders(home / "pgdata")


def start_holder(home: Path) -> int | None:
    try:
        return int((home / HOLDER_PID_FILE).read_text())
    except (OSError, ValueError):
        return None


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A PGEMBED_HOME; whatever a failed test leaves running there is killed afterwards."""
    home = tmp_path / "home"
    try:
        yield home
    finally:
        for pid in {*holders(home), start_holder(home)}:
            if pid is not None and is_alive(pid):
                os.kill(pid, signal.SIGKILL)
        server = postmaster_pid(home)
        if server is not None:
            os.kill(server, signal.SIGQUIT)  # immediate shutdown
            wait_for(lambda: not is_alive(server), 15, "the embedded server to stop")


def wait_until_holding(home: Path, proc: subprocess.Popen[str]) -> None:
    def holding() -> bool:
        assert proc.poll() is None, proc.communicate()[1]
        return proc.pid in holders(home) and postmaster_pid(home) is not None

    wait_for(holding, 60, f"pid {proc.pid} to hold the embedded server")


def test_start_url_psql_stop(home: Path) -> None:
    status = run(home, "db", "status")
    assert status.returncode == 0 and status.stdout.startswith("embedded server: not running")
    nothing = run(home, "db", "stop")
    assert nothing.returncode == 0, nothing.stderr
    assert nothing.stdout.startswith("nothing to stop")

    started = run(home, "db", "start")
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    assert url.startswith("postgresql://postgres") and "started" in started.stderr
    holder, server = start_holder(home), postmaster_pid(home)
    assert holder is not None and is_alive(holder) and server is not None
    again = run(home, "db", "start")
    assert again.returncode == 0 and again.stdout.strip() == url
    assert "already running" in again.stderr
    printed = run(home, "db", "url")
    assert printed.returncode == 0 and printed.stdout.strip() == url
    assert printed.stderr == ""  # `db start` holds it: no warning

    with psycopg.connect(url, autocommit=True) as conn:  # an application of the user's
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text)")
        conn.execute("INSERT INTO notes VALUES (1, 'hello')")
    selected = run(home, "db", "psql", "-At", "-c", "SELECT body FROM notes")
    assert selected.returncode == 0 and selected.stdout == "hello\n", selected.stderr
    failed = run(home, "db", "psql", "-c", "SELECT 1/0")
    assert failed.returncode == 1 and "division by zero" in failed.stderr  # psql's exit code
    status = run(home, "db", "status")
    assert status.returncode == 0
    assert f"url: {url}" in status.stdout
    assert f"held by: 1 process: {holder} (pgembed db start)" in status.stdout
    assert postmaster_pid(home) == server  # every command above joined the same server

    stopped = run(home, "db", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.splitlines() == [
        f"stopped the `pgembed db start` holder (pid {holder})",
        "the embedded server stopped",
    ]
    assert not is_alive(holder) and not is_alive(server) and postmaster_pid(home) is None
    assert start_holder(home) is None and holders(home) == []
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url, connect_timeout=5)
    assert run(home, "db", "stop").stdout.startswith("nothing to stop")
    # The table outlives the server.
    again = run(home, "db", "psql", "-At", "-c", "SELECT count(*) FROM notes")
    assert again.returncode == 0 and again.stdout == "1\n", again.stderr
    assert postmaster_pid(home) is None  # psql's pgembed was the last holder


def test_holders_killed_or_still_running(home: Path) -> None:
    assert run(home, "migrate").returncode == 0  # `status` needs the schema

    # SIGTERM: the holder takes the normal exit path and stops the server it held last.
    with watching(home) as watch:
        wait_until_holding(home, watch)
        watch.send_signal(signal.SIGTERM)
        assert watch.wait(timeout=30) == 128 + signal.SIGTERM
    assert postmaster_pid(home) is None and holders(home) == []

    # SIGKILL: the dead pid stays in the handle file; `db status` forgets it and stops the server.
    with watching(home) as watch:
        wait_until_holding(home, watch)
        watch.kill()
        watch.wait(timeout=30)
    assert postmaster_pid(home) is not None and holders(home) == [watch.pid]
    status = run(home, "db", "status")
    assert status.returncode == 0
    assert status.stdout.splitlines() == [
        "stopped the embedded server: no live pgembed process held it any more",
        f"embedded server: not running (data directory {home / 'pgdata'})",
    ]
    assert postmaster_pid(home) is None and holders(home) == []

    # A holder killed while another runs does not count when that other one, the last, exits.
    with watching(home) as killed, watching(home) as last:
        wait_until_holding(home, killed)
        wait_until_holding(home, last)
        killed.kill()
        killed.wait(timeout=30)
        assert killed.pid in holders(home)
        last.send_signal(signal.SIGTERM)
        assert last.wait(timeout=30) == 128 + signal.SIGTERM
    assert postmaster_pid(home) is None and holders(home) == []

    # Another pgembed process keeps the server up after `db stop`, and `db stop` says so.
    assert run(home, "db", "start").returncode == 0
    with watching(home) as watch:
        wait_until_holding(home, watch)
        url = run(home, "db", "url")
        assert url.returncode == 0 and url.stderr == ""
        stopped = run(home, "db", "stop")
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.splitlines()[1] == (
            f"the embedded server stays up, held by 1 process: {watch.pid} (pgembed status "
            "--watch --interval 0.5); it stops when the last of them exits"
        )
        assert postmaster_pid(home) is not None
        url = run(home, "db", "url")  # now only `status --watch` holds it: a note says so
        assert url.returncode == 0 and url.stderr.startswith("pgembed: note: this URL works only")
        assert f"now 1 process: {watch.pid}" in url.stderr
        watch.send_signal(signal.SIGTERM)
        assert watch.wait(timeout=30) == 128 + signal.SIGTERM
    assert postmaster_pid(home) is None and holders(home) == []


def test_database_url_after_the_subcommand(home: Path, tmp_path: Path) -> None:
    started = run(home, "db", "start")
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    elsewhere = tmp_path / "elsewhere"  # a PGEMBED_HOME whose embedded server must not start
    try:
        migrated = run(elsewhere, "migrate", "--database-url", url)
        assert migrated.returncode == 0, migrated.stderr
        status = run(elsewhere, "status", "--database-url", url)
        assert status.returncode == 0 and status.stdout.startswith("no models"), status.stderr
        # The later one wins, either way round.
        later = run(elsewhere, "--database-url", UNREACHABLE, "status", "--database-url", url)
        assert later.returncode == 0, later.stderr
        later = run(elsewhere, "--database-url", url, "status", f"--database-url={UNREACHABLE}")
        assert later.returncode == 1
        assert later.stderr.startswith("pgembed: error: cannot connect to postgresql://bob:***@")
        assert "hunter2" not in later.stderr
        # `db psql` takes it before or among psql's arguments.
        for args in (["--database-url", url, "-c", "SELECT 7"], ["-c", "SELECT 7", "--database-url", url]):  # fmt: skip  # noqa: E501
            psql = run(elsewhere, "db", "psql", "-At", *args)
            assert psql.returncode == 0 and psql.stdout == "7\n", psql.stderr
        printed = run(elsewhere, "db", "url", "--database-url", UNREACHABLE, "--show-password")
        assert printed.returncode == 0 and printed.stdout == UNREACHABLE + "\n"
        for command in ("start", "stop", "status"):
            refused = run(elsewhere, "db", command, "--database-url", url)
            assert refused.returncode == 2
            assert refused.stderr.startswith(
                f"pgembed: error: `pgembed db {command}` manages only the embedded server"
            )
            assert len(refused.stderr.splitlines()) == 1
        assert not (elsewhere / "pgdata").exists()
    finally:
        assert run(home, "db", "stop").returncode == 0
    assert postmaster_pid(home) is None


def test_the_started_servers_own_url_in_the_environment_is_fine(home: Path) -> None:
    # docs/database.md: export DATABASE_URL=$(pgembed db start); ...; pgembed db stop
    url = run(home, "db", "start").stdout.strip()
    assert url.startswith("postgresql://"), url
    env = {**os.environ, "PGEMBED_HOME": str(home), "DATABASE_URL": url}
    env.pop("PGEMBED_DATABASE_URL", None)
    for args in (("db", "status"), ("db", "stop")):
        done = subprocess.run(
            [sys.executable, "-m", "pgembed", *args],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    assert postmaster_pid(home) is None


def test_a_server_restarted_under_its_holder_stops_with_the_last_one(home: Path) -> None:
    """Stopped from outside (pg_ctl stop, a crash) and started again by the next command while a
    holder still ran: the wheel's exit handler only stops the postmaster it adopted, so the last
    holder's exit used to leave the restarted server running with no holder at all."""
    started = run(home, "db", "start")
    assert started.returncode == 0, started.stderr
    holder, first = start_holder(home), postmaster_pid(home)
    assert holder is not None and first is not None
    pg_ctl = [str(wheel.bin_dir() / "pg_ctl"), "-D", str(home / "pgdata"), "-m", "fast", "-w"]
    subprocess.run([*pg_ctl, "stop"], user=wheel.server_user(), check=True, capture_output=True)
    assert postmaster_pid(home) is None
    queried = run(home, "db", "psql", "-At", "-c", "SELECT 1")  # restarts it, then leaves
    assert queried.returncode == 0 and queried.stdout == "1\n", queried.stderr
    second = postmaster_pid(home)
    assert second is not None and second != first
    assert holders(home) == [holder]  # the query's pgembed is gone; the holder still holds

    os.kill(holder, signal.SIGTERM)  # the last holder exits (as a sync daemon or serve would)
    wait_for(lambda: not is_alive(holder), 60, "the holder to exit")
    wait_for(lambda: postmaster_pid(home) is None, 30, "the restarted server to stop")
    assert not is_alive(second) and holders(home) == []


def test_a_sync_daemon_starts_a_server_stopped_under_it_again(home: Path) -> None:
    """docs/database.md: a server stopped from outside (a crash) is started again by the next
    command that needs it; a running daemon is one, and goes on embedding."""
    for args in (
        ("migrate",),
        ("db", "psql", "-c", "CREATE TABLE notes (id int PRIMARY KEY, body text)"),
        ("model", "add", "minilm", "--table", "notes", "--column", "body", "--precision", "fp32"),
    ):
        done = run(home, *args)
        assert done.returncode == 0, done.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PGEMBED_DATABASE_URL", "DATABASE_URL")}
    env["PGEMBED_HOME"] = str(home)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "pgembed", "sync", "--poll-seconds", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        wait_for(lambda: daemon.pid in holders(home), 120, "the daemon to hold the server")
        first = postmaster_pid(home)
        pg_ctl = [str(wheel.bin_dir() / "pg_ctl"), "-D", str(home / "pgdata"), "-m", "fast", "-w"]
        subprocess.run([*pg_ctl, "stop"], user=wheel.server_user(), check=True, capture_output=True)
        wait_for(lambda: postmaster_pid(home) not in (None, first), 60, "the server to restart")
        assert daemon.poll() is None
        inserted = run(home, "db", "psql", "-c", "INSERT INTO notes VALUES (1, 'A quiet film.')")
        assert inserted.returncode == 0, inserted.stderr

        def embedded() -> bool:
            query = "SELECT count(embedding_minilm) FROM notes"
            return run(home, "db", "psql", "-At", "-c", query).stdout == "1\n"

        wait_for(embedded, 60, "the daemon to embed a row after the restart")
    finally:
        daemon.send_signal(signal.SIGTERM)
        _, err = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, err
    assert "database fault" in err
    wait_for(lambda: postmaster_pid(home) is None, 30, "the server to stop with its last holder")
