"""The embedded server's life: started (or joined) on demand, its URL, its state, and stopped when
no live process holds it any more.

This process starts the server itself, locked down (`access`), under the holders' lock; the wheel
then adopts it and counts this process as a holder until it exits; the last one stops it, whichever
postmaster runs by then (`_release`).
"""

from __future__ import annotations

import atexit
import os
import subprocess
import threading
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from pgembed import config
from pgembed.embedded import access, holders, wheel
from pgembed.errors import ConfigError

START_SECONDS = 120.0  # initdb on a first start, then the server's own start

_url: str | None = None
_url_lock = threading.Lock()


def data_dir() -> Path:
    return config.home() / "pgdata"


def url() -> str:
    """Start (or join) the embedded server and return its connection URL."""
    global _url
    with _url_lock:  # two threads (two Clients, an AsyncClient's gather) start it once
        if _url is None:
            _url = _start(data_dir())
        return _url


def _start(pgdata: Path) -> str:
    with holders.locked():
        holders.forget_dead(pgdata)
        try:
            # Started (or locked down) by us before the wheel adopts it: still under the lock, so a
            # last holder exiting meanwhile cannot stop it and leave the wheel to start it its way.
            _prepare(pgdata)
            found = wheel.adopt(pgdata)
        except Exception as exc:
            raise _cannot_start(pgdata, exc) from None
    # Runs before the wheel's exit handler (atexit is last in, first out): see _release.
    atexit.register(_release, pgdata)
    return found


def revive() -> None:
    """Start the server again if it stopped while this process held it (pg_ctl stop, a crash):
    a long-running holder (`pgembed sync`) brings it back as the next command would. Nothing
    when it runs (or is still starting or stopping), or when this process never joined it."""
    if _url is None:
        return
    pgdata = data_dir()
    try:
        with holders.locked():
            if running_postmaster(pgdata) is None:
                _prepare(pgdata)
    except Exception as exc:  # a daemon that brings it back must not die of an OSError
        raise _cannot_start(pgdata, exc) from None


def _cannot_start(pgdata: Path, exc: Exception) -> ConfigError:
    log = pgdata / "log"
    return ConfigError(
        f"cannot start the embedded PostgreSQL in {pgdata}: {exc} (server log: {log})"
    )


def _release(pgdata: Path) -> None:
    """At exit: this process no longer holds the server, and the last live holder stops it.

    Decided here rather than by the wheel's exit handler, which runs next: that one stops the
    server only if the postmaster this process adopted still runs, so after a stop from outside
    (pg_ctl stop, a crash) and a restart by another pgembed process, the last holder's exit
    left the restarted server running with no holder at all. A holder killed meanwhile does not
    count (forget_dead). The wheel's handler then finds this process off the list: it does
    nothing. Never raises: an exit must not fail for it."""
    with suppress(Exception), holders.locked():
        others = [pid for pid in holders.forget_dead(pgdata) if pid != os.getpid()]
        wheel.set_holders(pgdata, others)
        if not others and running_postmaster(pgdata) is not None:
            _stop_server(pgdata)


def _prepare(pgdata: Path) -> None:
    """Initialise, restrict and start the server unless it runs; lock down one that runs (an
    older pgembed started it with trust authentication and perhaps a world-writable socket)."""
    user = wheel.server_user()
    pgdata.mkdir(exist_ok=True)
    if user is not None:
        wheel.let_server_user_in(pgdata, user)
    if not (pgdata / "PG_VERSION").exists():
        _pg(["initdb", "-D", str(pgdata), *access.INITDB_OPTIONS], user)
    changed = access.write_auth_files(pgdata)
    info = running_postmaster(pgdata)
    if info is None:
        options = access.server_options(pgdata)
        log = str(pgdata / "log")
        _pg(["pg_ctl", "-D", str(pgdata), "-l", log, "-o", options, "-w", "start"], user)
        return
    if changed:
        _pg(["pg_ctl", "-D", str(pgdata), "reload"], user)
    if info.socket_dir is not None and info.socket_dir != pgdata:
        access.make_private(info.socket_dir, pgdata.stat())


def _pg(command: list[str], user: str | None) -> None:
    """Run one of the wheel's PostgreSQL programs as the server's user; a failure is one line."""
    program = [str(wheel.bin_dir() / command[0]), *command[1:]]
    try:
        subprocess.run(
            program, user=user, capture_output=True, text=True, check=True, timeout=START_SECONDS
        )
    except subprocess.CalledProcessError as exc:
        said = " ".join(line.strip() for line in exc.stderr.splitlines() if line.strip())
        raise ConfigError(f"{command[0]} failed: {said or 'no message'}") from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"cannot run {command[0]}: {exc}") from None


# --- what runs, for `pgembed db status/stop` (without joining the server) -----------------------


@dataclass(frozen=True)
class State:
    data_dir: Path
    server_pid: int | None  # the postmaster, None when the server is not running
    url: str | None
    holders: tuple[int, ...]  # live pgembed processes that hold the server
    start_holder: int | None  # the `pgembed db start` holder among them, if any
    stopped_orphan: bool = False  # inspect stopped a server that no live process held

    @property
    def running(self) -> bool:
        return self.server_pid is not None


def inspect() -> State:
    """The embedded server's state. Forgets dead holders, and stops a server no live holder holds
    (its last holder was killed with SIGKILL, or died while starting it)."""
    pgdata = data_dir()
    with holders.locked():
        alive = holders.forget_dead(pgdata)
        found = postmaster(pgdata)
        orphan = found is not None and not alive
        if orphan:
            _stop_server(pgdata)
            found = postmaster(pgdata)
    return State(
        data_dir=pgdata,
        server_pid=found[0] if found else None,
        url=found[1] if found else None,
        holders=tuple(alive),
        start_holder=holders.start_holder_pid(),
        stopped_orphan=orphan and found is None,
    )


def running_url() -> str | None:
    """The URL of the embedded server if it runs, without joining it."""
    found = postmaster(config.home(create=False) / "pgdata")
    return found[1] if found else None


def postmaster(pgdata: Path) -> tuple[int, str] | None:
    """(pid, URL) of the server running in `pgdata`, or None."""
    info = running_postmaster(pgdata)
    if info is None or info.url is None:
        return None
    return info.pid, info.url


def running_postmaster(pgdata: Path) -> wheel.Postmaster | None:
    """postmaster.pid when the server it names runs, else None."""
    info = wheel.read_postmaster(pgdata)
    if info is None or not holders.is_alive(info.pid):
        return None
    return info


def _stop_server(pgdata: Path) -> None:
    """pg_ctl stop (fast: open sessions are ended), as the data directory's owner."""
    owner = pgdata.stat().st_uid
    user = owner if os.geteuid() == 0 and owner != 0 else None
    command = [str(wheel.bin_dir() / "pg_ctl"), "-D", str(pgdata), "-m", "fast", "-w", "stop"]
    try:
        subprocess.run(command, user=user, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(
            f"cannot stop the embedded PostgreSQL in {pgdata}: {exc} (server log: {pgdata / 'log'})"
        ) from None
