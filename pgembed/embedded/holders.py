"""Who holds the embedded server: the live holders (dead ones forgotten), what each process is,
and the pid file of the `pgembed db start` holder.

Every pgembed process that uses the server is a holder; the server stops with the last one. A
holder killed with SIGKILL never unregisters: without `forget_dead` the server would never stop.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from pgembed import config
from pgembed.embedded import wheel

HOLDER_PID_FILE = "db-start.pid"  # under PGEMBED_HOME: the `pgembed db start` holder
HOLDER_LOG_FILE = "db-start.log"  # its stderr (the reason, when it cannot start the server)


@contextmanager
def locked() -> Iterator[None]:
    """No other process edits the holders, or starts or stops a server, meanwhile."""
    with wheel.holders_locked():
        yield


def forget_dead(pgdata: Path) -> list[int]:
    """Remove the dead holders of the server in `pgdata` (under `locked`); the live ones."""
    pids = wheel.holders(pgdata)
    alive = [pid for pid in pids if pid == os.getpid() or is_alive(pid)]
    if alive != pids:
        wheel.set_holders(pgdata, alive)
    return alive


def is_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    # A zombie (dead, not yet reaped by its parent) still answers signal 0.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): trust the signal
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def describe_process(pid: int) -> str:
    """A short description of a process (`pgembed status --watch`), or '' when unknown."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return ""
    return describe_argv([a for a in argv if a])


def describe_argv(argv: list[str]) -> str:
    """`python -m pgembed db hold` and `.venv/bin/pgembed db hold` are `pgembed db hold`."""
    for i, arg in enumerate(argv[:3]):
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] == "pgembed":
            return " ".join(["pgembed", *argv[i + 2 :]])
        if Path(arg).name == "pgembed":
            return " ".join(["pgembed", *argv[i + 1 :]])
    return " ".join(argv)


# --- the `pgembed db start` holder's pid file ----------------------------------------------------


def pid_file() -> Path:
    return config.home() / HOLDER_PID_FILE


def start_holder_pid() -> int | None:
    """The live `pgembed db start` holder, or None (a stale pid file is removed)."""
    path = pid_file()
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    # The pid of a holder that died long ago may belong to another process by now.
    if is_alive(pid) and describe_process(pid) in ("", "pgembed db hold"):
        return pid
    with suppress(OSError):
        path.unlink()
    return None


def write_pid_file() -> None:
    """This process is the `pgembed db start` holder; at exit it no longer is."""
    path = pid_file()
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(f"{os.getpid()}\n")
    tmp.replace(path)
    # Registered after joining the server: runs before the wheel's exit handler (LIFO).
    atexit.register(_remove_pid_file, path, os.getpid())


def _remove_pid_file(path: Path, pid: int) -> None:
    with suppress(OSError, ValueError):
        if int(path.read_text().strip()) == pid:
            path.unlink()
