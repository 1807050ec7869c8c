"""`pgembed db start` and `db stop`: a detached holder that keeps the embedded server up for
applications while no other pgembed process runs, and its end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from pgembed import config
from pgembed.embedded import holders, server
from pgembed.errors import ConfigError

STOP_SECONDS = 30.0


@contextmanager
def _start_locked() -> Iterator[None]:
    """One `db start` or `db stop` at a time (per PGEMBED_HOME)."""
    import fcntl

    with (config.home() / "db-start.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def hold() -> None:
    """Be the `pgembed db start` holder: join the server, write the pid file, wait for a signal.

    SIGTERM takes the normal exit path (the CLI's handler), where atexit removes the pid file and
    then unregisters this holder, stopping the server if it was the last."""
    server.url()
    holders.write_pid_file()
    while True:
        signal.pause()


def start() -> tuple[int, bool]:
    """Spawn the detached holder unless one runs: (its pid, whether it was already running)."""
    with _start_locked():
        running = holders.start_holder_pid()
        if running is not None:
            if server.postmaster(server.data_dir()) is not None:
                return running, True
            _end(running)  # it holds a server that was stopped under it (pg_ctl stop, a crash)
        return _spawn_holder(), False


def _spawn_holder() -> int:
    home = config.home()
    log = home / holders.HOLDER_LOG_FILE
    env = {k: v for k, v in os.environ.items() if k not in config.URL_ENV_VARS}
    env["PGEMBED_HOME"] = str(home)
    with log.open("w") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "pgembed", "db", "hold"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # no terminal: no SIGHUP or Ctrl-C of the shell reaches it
            close_fds=True,
            cwd=home,
            env=env,
        )
    try:
        deadline = time.monotonic() + server.START_SECONDS
        while holders.start_holder_pid() != child.pid:
            code = child.poll()
            if code is not None:
                raise ConfigError(
                    f"the embedded server's holder exited with code {code}: "
                    f"{_last_line(log)} (log: {log})"
                )
            if time.monotonic() > deadline:
                child.terminate()
                raise ConfigError(
                    f"the embedded server did not start within {server.START_SECONDS:.0f}s "
                    f"(log: {log})"
                )
            time.sleep(0.1)
        return child.pid
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)  # it outlives us on purpose
            del child


def _last_line(path: Path) -> str:
    with suppress(OSError):
        for line in reversed(path.read_text(errors="replace").splitlines()):
            if line.strip():
                return line.strip().removeprefix("pgembed: error: ")
    return "no message"


def stop() -> int | None:
    """End the `pgembed db start` holder (SIGTERM, then wait): its pid, or None if none ran."""
    with _start_locked():
        pid = holders.start_holder_pid()
        if pid is not None:
            _end(pid)
        return pid


def _end(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    while holders.is_alive(pid):
        if time.monotonic() > deadline:
            raise ConfigError(
                f"the holder (pid {pid}) did not exit within {STOP_SECONDS:.0f}s of SIGTERM: "
                f"`kill -KILL {pid}`, then `pgembed db stop` stops the server"
            )
        time.sleep(0.1)
    with suppress(OSError):
        holders.pid_file().unlink()  # if it died before removing it
