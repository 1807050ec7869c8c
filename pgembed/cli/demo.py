"""`pgembed demo`: sample reviews, two poolings of one checkpoint, answers side by side.

Everything it makes has a name of its own, so it never meets a user's tables or models: the
table pgembed_demo.reviews (in a schema of its own) and the models demo_mean and demo_cls.
Running it again adds nothing; `--reset` removes exactly what it made.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import click
import psycopg
from psycopg import sql

from pgembed import db, migrate, samples
from pgembed.catalog import registry
from pgembed.cli import terminal
from pgembed.cli.app import App, pass_app
from pgembed.cli.progress import progress_bar
from pgembed.embedded import server
from pgembed.errors import UsageError
from pgembed.lifecycle import models
from pgembed.search import planner
from pgembed.sync import store, worker

SCHEMA, TABLE = "pgembed_demo", "reviews"
MODELS = (("demo_mean", "mean"), ("demo_cls", "cls"))
QUERIES = (
    "phone dies before the end of the day",
    "crisp sweet fruit",
    "the Apple charger stopped working",
    "package showed up late and damaged",
    "blocks out noise on the train",
)


@click.command("demo")
@click.option("--reset", is_flag=True, help="Remove what the demo made (its models and table).")
@pass_app
def demo_cmd(app: App, reset: bool) -> None:
    """Embed sample reviews (pgembed_demo.reviews) with two poolings and compare their answers."""
    if reset:
        reset_demo(app.url, terminal.echo)
    else:
        run(app.url, terminal.echo, where=location(app.explicit_url))


def location(explicit_url: str | None) -> str:
    """Where the demo's rows live, for a second run that finds them there: the database given,
    or the embedded one, which every clone and project of this OS user shares unless
    PGEMBED_HOME gives it another place."""
    if explicit_url is not None:
        return "this database"
    if os.environ.get("PGEMBED_HOME"):
        return f"the embedded database in {server.data_dir()} (PGEMBED_HOME)"
    return (
        f"the embedded database in {server.data_dir()}, which every clone and project of this "
        "OS user shares (PGEMBED_HOME=$PWD/.pgembed gives a project its own: README, "
        '"Where the embedded database lives")'
    )


def run(url: str, echo: Callable[[str], None], where: str = "this database") -> None:
    with db.connection(url) as conn:
        for migration in migrate.migrate(conn):
            echo(f"applied migration {migration.filename}")
    with db.connection(url) as conn:  # reconnect: pgvector's types exist now
        _refuse_foreign_models(conn)
        inserted = samples.load(conn, SCHEMA, TABLE)
        if inserted:
            echo(f"{SCHEMA}.{TABLE}: {inserted} sample rows inserted")
        else:
            echo(
                f"{SCHEMA}.{TABLE}: the sample rows are already there: an earlier `pgembed demo` "
                f"put them in {where}"
            )
        for name, pooling in MODELS:
            if not registry.exists(conn, name):
                request = models.AddRequest(name, f"{SCHEMA}.{TABLE}", "text", pooling=pooling)
                models.add(conn, request)
                echo(f"added model {name} (all-MiniLM-L6-v2, {pooling} pooling)")
        total = store.queued_count(conn, [name for name, _ in MODELS])
    if total == 0:
        echo("synced: every sample row already has both models' vectors\n")
    else:
        with progress_bar(total, "embedding") as advance:
            options = worker.Options(models=tuple(n for n, _ in MODELS), once=True)
            stats = worker.Worker(url, options, on_progress=lambda _m, n: advance(n)).run()
        echo(f"synced: {stats.written} vectors written\n")
    with db.connection(url) as conn:
        specs = [registry.get(conn, name) for name, _ in MODELS]
        for text in QUERIES:
            echo(f'query: "{text}"')
            columns = [planner.query(conn, spec, text, k=3) for spec in specs]
            echo(f"  {'demo_mean (mean pooling)':<58}  demo_cls (CLS pooling)")
            for mean_hit, cls_hit in zip(*columns, strict=False):
                echo(f"  {_cell(mean_hit)}  {_cell(cls_hit)}")
            echo("")
    echo(
        "Mean pooling is what all-MiniLM-L6-v2 was trained for; a BERT [CLS] vector of the same "
        'checkpoint ranks by surface features.\nTry: pgembed query "battery drains fast" '
        "--model demo_mean   (remove the demo with: pgembed demo --reset)"
    )


def reset_demo(url: str, echo: Callable[[str], None]) -> None:
    """Remove the demo's models, table and schema; nothing else. A schema the user has put
    other objects into is left in place, and said so."""
    with db.connection(url) as conn:
        migrate.require_current(conn)
        _refuse_foreign_models(conn)
        for name, _ in MODELS:
            if registry.exists(conn, name):
                models.remove(conn, name)
                echo(f"removed model {name}")
        with conn.transaction():
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(SCHEMA, TABLE)))
        try:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {}").format(sql.Identifier(SCHEMA)))
        except psycopg.errors.DependentObjectsStillExist:
            echo(f"kept schema {SCHEMA}: it holds objects the demo did not make")
            return
    echo(f"dropped {SCHEMA}.{TABLE}: the demo is gone")


def _refuse_foreign_models(conn: psycopg.Connection) -> None:
    """A model of the demo's name on another table is the user's: never touch it."""
    for name, _ in MODELS:
        if registry.exists(conn, name):
            spec = registry.get(conn, name)
            if (spec.table_schema, spec.table_name) != (SCHEMA, TABLE):
                raise UsageError(
                    f"model {name} belongs to {spec.qualified_table}, not the demo: rename or "
                    "remove it to run the demo"
                )


def _cell(hit: planner.Hit, width: int = 58) -> str:
    text = " ".join(hit.text.split())
    body = f"{hit.similarity:.2f} {text}"
    return body if len(body) <= width else body[: width - 1] + "…"
