"""The root command: per-invocation state (App), one line per error instead of a traceback,
`--database-url` accepted after any subcommand too, and SIGTERM/SIGHUP taking the normal exit."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, NoReturn

import click
import psycopg

from pgembed import config, db, locate, migrate
from pgembed.cli import terminal
from pgembed.errors import PgembedError

URL_HELP = (
    "PostgreSQL URL. Default: $PGEMBED_DATABASE_URL, $DATABASE_URL, else the embedded server."
)


class App:
    """Per-invocation state: the database URL is resolved lazily so `--help` starts nothing."""

    def __init__(self, database_url: str | None) -> None:
        self._explicit = database_url
        self._url: str | None = None

    def set_database_url(self, database_url: str) -> None:
        """`--database-url` given again after a subcommand: the later one wins."""
        self._explicit = database_url
        self._url = None

    @property
    def explicit_url(self) -> str | None:
        """The URL from the option or the environment, or None for the embedded server."""
        return config.database_url(self._explicit)

    @property
    def url_source(self) -> str:
        """Where the explicit URL comes from, for messages."""
        if self._explicit:
            return "--database-url"
        return next((f"${var}" for var in config.URL_ENV_VARS if os.environ.get(var)), "")

    @property
    def url(self) -> str:
        if self._url is None:
            self._url = locate.resolve_url(self._explicit)
        return self._url

    @contextmanager
    def connect(self, *, require_schema: bool = True) -> Iterator[psycopg.Connection]:
        with db.connection(self.url) as conn:
            if require_schema:
                migrate.require_current(conn)
            yield conn


def fail(message: str, code: int = 1) -> NoReturn:
    terminal.echo(f"pgembed: error: {message}", err=True)
    sys.exit(code)


# click >= 8.2's error for a group given no command: its help, exit 2 (none before 8.2).
_NO_ARGS_IS_HELP: type[click.UsageError] | tuple[()] = getattr(
    click.exceptions, "NoArgsIsHelpError", ()
)


def usage_fail(exc: click.UsageError) -> NoReturn:
    """click's usage error as one line, like every other error, with where the help is (click
    prints usage, a hint and the error on three lines). A group given no command shows its help
    as click does (click 8.2 and later raise that as a usage error too)."""
    if isinstance(exc, _NO_ARGS_IS_HELP):
        raise exc
    message = " ".join(exc.format_message().split()).rstrip(".")
    command = exc.ctx.command_path if exc.ctx is not None else "pgembed"
    fail(f"{message} (see `{command} --help`)", exc.exit_code)


def _late_url(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        app = ctx.find_object(App)
        if app is not None:
            app.set_database_url(value)


def _accept_url_option(command: click.Command) -> None:
    """Give `command` (and, for a group, every command in it) its own `--database-url`, so it
    may follow the subcommand: `pgembed status --database-url URL`."""
    if not any(p.name == "database_url" for p in command.params):
        command.params.append(
            click.Option(
                ["--database-url"],
                metavar="URL",
                expose_value=False,
                callback=_late_url,
                help=URL_HELP,
            )
        )
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _accept_url_option(sub)


class Group(click.Group):
    """Turns every pgembed, database and interrupt error into one line and an exit code."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        _accept_url_option(cmd)
        super().add_command(cmd, name)

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:  # an option of the group itself
            usage_fail(exc)

    def invoke(self, ctx: click.Context) -> Any:
        with _signal_handlers_restored():
            try:
                return super().invoke(ctx)
            except click.UsageError as exc:  # a command or its options
                usage_fail(exc)
            except PgembedError as exc:
                fail(str(exc), exc.exit_code)
            except psycopg.Error as exc:
                fail(db.describe(exc).args[0])
            except KeyboardInterrupt:
                fail("interrupted", 130)


@contextmanager
def _signal_handlers_restored() -> Iterator[None]:
    """The handlers a command installs (exit_on_termination, sync's and serve's graceful stops)
    end with it: a process that runs `main` in-process (tests, CliRunner) gets its own back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    saved = {signum: signal.getsignal(signum) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def exit_on_termination() -> None:
    """SIGTERM and SIGHUP raise SystemExit: `finally` blocks and atexit run, so a holder of the
    embedded server unregisters (and stops it when it was the last). A second signal while
    exiting ends the process at once. A signal ignored by the parent (`nohup`) stays ignored;
    a command may install its own handler afterwards (`pgembed sync` finishes its batch)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        signal.signal(signum, signal.SIG_DFL)
        sys.exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, handler)


@contextmanager
def stopping(stop: Callable[[], None]) -> Iterator[None]:
    """SIGINT/SIGTERM call `stop` (a clean stop: finish what is in hand) instead of ending the
    process; the handlers before come back after."""

    def handler(_signum: int, _frame: object) -> None:
        stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


pass_app = click.make_pass_decorator(App)


@click.group(cls=Group)
@click.option("--database-url", metavar="URL", help=URL_HELP + " Also accepted after a command.")
@click.version_option(package_name="pgembed")
@click.pass_context
def main(ctx: click.Context, database_url: str | None) -> None:
    """Keep pgvector embeddings of a table's text fresh and searchable."""
    exit_on_termination()
    ctx.obj = App(database_url)
