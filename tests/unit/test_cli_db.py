"""`--database-url` after any command, `pgembed db` without a server, the exit on SIGTERM, and
how a dead holder is recognised. No database: the embedded server is never started here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from pgembed.cli import main
from pgembed.cli.db import _password_in_env, _take_url_option
from pgembed.embedded import holders
from pgembed.errors import UsageError

Invoke = Callable[..., Result]


@pytest.fixture(autouse=True)
def _restore_signal_handlers() -> Iterator[None]:
    """The root command installs SIGTERM/SIGHUP handlers: keep them out of pytest's process."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ("PGEMBED_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PGEMBED_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def invoke(home: Path) -> Invoke:
    def run(*args: str) -> Result:
        return CliRunner().invoke(main, list(args))

    return run


def commands(group: click.Group, path: str = "pgembed") -> Iterator[tuple[str, click.Command]]:
    for name, command in group.commands.items():
        yield f"{path} {name}", command
        if isinstance(command, click.Group):
            yield from commands(command, f"{path} {name}")


def test_every_command_takes_database_url_after_its_name() -> None:
    found = dict(commands(main))
    assert {"pgembed status", "pgembed model add", "pgembed db psql"} <= found.keys()
    for name, command in found.items():
        options = [opt for param in command.params for opt in getattr(param, "opts", [])]
        assert "--database-url" in options, name


def test_the_later_database_url_wins(invoke: Invoke) -> None:
    bad = invoke("--database-url", "postgresql://a@h/d", "status", "--database-url", "mysql://x")
    assert bad.exit_code == 1
    assert bad.stderr.startswith("pgembed: error: malformed database URL 'mysql://x'")
    printed = invoke(
        "--database-url", "mysql://x", "db", "url", "--database-url=postgresql://a@h/d"
    )
    assert printed.exit_code == 0 and printed.stdout == "postgresql://a@h/d\n"
    on_group = invoke("model", "--database-url", "mysql://y", "list")
    assert on_group.exit_code == 1 and "'mysql://y'" in on_group.stderr


def test_db_url_prints_an_explicit_url_as_given(invoke: Invoke, home: Path) -> None:
    url = "postgresql://alice:s3cret@db.example:5432/app?sslmode=require"
    printed = invoke("db", "url", "--database-url", url, "--show-password")
    assert printed.exit_code == 0 and printed.stdout == url + "\n" and printed.stderr == ""
    masked = invoke("db", "url", "--database-url", url)
    assert masked.stdout == url.replace("s3cret", "***") + "\n" and "masked" in masked.stderr
    assert not home.exists()  # nothing embedded was started, or even prepared


@pytest.mark.parametrize("command", ["start", "stop", "status"])
def test_db_management_refuses_an_explicit_url(
    invoke: Invoke, home: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    refused = invoke("db", command, "--database-url", "postgresql://a@h/d")
    assert refused.exit_code == 2
    assert refused.stderr.splitlines() == [
        f"pgembed: error: `pgembed db {command}` manages only the embedded server, but a "
        "database URL is set (--database-url); pgembed neither starts nor stops that server"
    ]
    monkeypatch.setenv("DATABASE_URL", "postgresql://a@h/d")
    refused = invoke("db", command)
    assert refused.exit_code == 2 and "($DATABASE_URL)" in refused.stderr
    assert not home.exists()


def test_psql_arguments() -> None:
    assert _take_url_option(("-c", "select 1")) == (("-c", "select 1"), None)
    assert _take_url_option(("-c", "x", "--database-url", "u1", "--database-url=u2", "-A")) == (
        ("-c", "x", "-A"),
        "u2",
    )
    with pytest.raises(UsageError):
        _take_url_option(("--database-url",))
    conninfo, env = _password_in_env("postgresql://alice:p%40ss@db:5432/app")
    assert conninfo == "postgresql://alice@db:5432/app" and env["PGPASSWORD"] == "p@ss"
    conninfo, env = _password_in_env("postgresql://postgres:@/postgres?host=/tmp/x")
    assert conninfo == "postgresql://postgres:@/postgres?host=/tmp/x"


def test_holders_are_described_by_their_command() -> None:
    python = sys.executable
    assert holders.describe_argv([python, "-m", "pgembed", "db", "hold"]) == "pgembed db hold"
    assert holders.describe_argv([python, "/venv/bin/pgembed", "sync"]) == "pgembed sync"
    assert holders.describe_argv([python, "app.py"]) == f"{python} app.py"
    assert holders.describe_process(os.getpid())


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_a_zombie_is_not_a_live_holder() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = Path(f"/proc/{child.pid}/stat")
    deadline = time.monotonic() + 30
    while stat.read_text().rpartition(")")[2].split()[0] != "Z":  # exited, not yet reaped
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.05)
    assert not holders.is_alive(child.pid)
    child.wait()
    assert not holders.is_alive(child.pid)
    assert holders.is_alive(os.getpid())


EXIT_ON_SIGNAL = textwrap.dedent(
    """
    import atexit, os, signal, sys, time
    from pgembed.cli.app import exit_on_termination
    if sys.argv[1] == "nohup":
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    exit_on_termination()
    atexit.register(lambda: print("atexit ran", flush=True))
    try:
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))
        time.sleep(30 if sys.argv[1] == "plain" else 0)  # the signal ends the sleep
    finally:
        print("finally ran", flush=True)
    """
)


@pytest.mark.parametrize(
    ("mode", "signame", "code", "out"),
    [
        ("plain", "SIGTERM", 128 + signal.SIGTERM, "finally ran\natexit ran\n"),
        ("plain", "SIGHUP", 128 + signal.SIGHUP, "finally ran\natexit ran\n"),
        ("nohup", "SIGHUP", 0, "finally ran\natexit ran\n"),  # ignored, as nohup asked
    ],
)
def test_sigterm_and_sighup_take_the_normal_exit(
    mode: str, signame: str, code: int, out: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", EXIT_ON_SIGNAL, mode, signame],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code, done.stderr
    assert done.stdout == out
