"""Clusters of a test's own, made with the embedded server's programs (initdb, pg_ctl): for what
the session's server cannot show (a streaming replica, TCP with passwords and no superuser)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from pgembed.embedded import access, wheel


def pg(*command: str) -> None:
    """Run one of the wheel's programs as the server's user."""
    program = [str(wheel.bin_dir() / command[0]), *command[1:]]
    done = subprocess.run(
        program, user=wheel.server_user(), capture_output=True, text=True, timeout=600, cwd="/"
    )
    assert done.returncode == 0, f"{command[0]}: {done.stdout} {done.stderr}"


def server_dir() -> Path:
    """An empty directory for a data directory, the server's user's (the socket lives in it:
    a short path under the temporary directory)."""
    path = Path(tempfile.mkdtemp(prefix="pgsb-"))
    user = wheel.server_user()
    if user is not None:
        shutil.chown(path, user, user)
    path.chmod(0o700)
    return path


def start(pgdata: Path, options: str = access.SERVER_OPTIONS) -> str:
    """Start the cluster (its socket in `pgdata`); the superuser's URL over that socket."""
    log = pgdata / "log"
    try:  # -t: a busy machine may take more than pg_ctl's default minute
        pg("pg_ctl", "-D", str(pgdata), "-l", str(log), "-o", f"{options} -k {pgdata}", "-w",
           "-t", "300", "start")  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{log.read_text()[-2000:]}") from None
    return f"postgresql://postgres@/postgres?host={pgdata}"
