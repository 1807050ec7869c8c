"""The root command: per-invocation state (App) and one line per error instead of a traceback."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click
import psycopg

from pgembed import db, migrate
from pgembed.errors import PgembedError


class App:
    """Per-invocation state: the database URL is resolved lazily so `--help` starts nothing."""

    def __init__(self, database_url: str | None) -> None:
        self._explicit = database_url
        self._url: str | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            self._url = db.resolve_url(self._explicit)
        return self._url

    @contextmanager
    def connect(self, *, require_schema: bool = True) -> Iterator[psycopg.Connection]:
        with db.connection(self.url) as conn:
            if require_schema:
                migrate.require_current(conn)
            yield conn


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"pgembed: error: {message}", err=True)
    sys.exit(code)


class Group(click.Group):
    """Turns every pgembed, database and interrupt error into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PgembedError as exc:
            fail(str(exc), exc.exit_code)
        except psycopg.Error as exc:
            fail(db.describe(exc).args[0])
        except KeyboardInterrupt:
            fail("interrupted", 130)


pass_app = click.make_pass_decorator(App)


@click.group(cls=Group)
@click.option(
    "--database-url",
    metavar="URL",
    help="PostgreSQL URL. Default: $PGEMBED_DATABASE_URL, $DATABASE_URL, else the embedded server.",
)
@click.version_option(package_name="pgembed")
@click.pass_context
def main(ctx: click.Context, database_url: str | None) -> None:
    """Keep pgvector embeddings of a table's text fresh and searchable."""
    ctx.obj = App(database_url)
