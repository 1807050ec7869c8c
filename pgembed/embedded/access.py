"""Only the user who started the embedded server may reach it: a private socket, peer
authentication, no TCP (docs/database.md, "Who may connect").

The wheel alone would start the server with trust authentication and, as root with a long
PGEMBED_HOME, its socket in a world-writable directory: any local user was superuser. So pgembed
initialises and starts the server itself (`server`), with these settings; the wheel then adopts it
and only counts holders.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
import tempfile
from contextlib import suppress
from pathlib import Path

from pgembed.errors import ConfigError

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


def server_options(pgdata: Path) -> str:
    """The postgres options (`pg_ctl -o`) of a server started on `pgdata`."""
    return f"{SERVER_OPTIONS} -k {shlex.quote(str(private_socket_dir(pgdata)))}"


def write_auth_files(pgdata: Path) -> bool:
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


def private_socket_dir(pgdata: Path) -> Path:
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
    make_private(path, owner)
    if not _fits(path):
        raise ConfigError(
            f"the data directory {pgdata} and the temporary directory {path.parent} are too long "
            "for a Unix socket's path: set a shorter PGEMBED_HOME or TMPDIR"
        )
    return path


def _fits(directory: Path) -> bool:
    return len(os.fsencode(directory / SOCKET_NAME)) <= SOCKET_PATH_MAX


def make_private(directory: Path, owner: os.stat_result) -> None:
    """The socket's directory: the server's user's alone (root, which may enter any, aside)."""
    found = directory.lstat()
    if os.geteuid() == 0 and (found.st_uid, found.st_gid) != (owner.st_uid, owner.st_gid):
        os.chown(directory, owner.st_uid, owner.st_gid, follow_symlinks=False)
    if stat.S_IMODE(found.st_mode) != 0o700:
        directory.chmod(0o700)
