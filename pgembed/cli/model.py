"""`pgembed model ...`: add, list, remove, fulltext and alter a model; `pgembed alter-table`
around the models of a table."""

from __future__ import annotations

import json
from typing import Any

import click

from pgembed.catalog import naming, registry
from pgembed.cli import terminal
from pgembed.cli.app import App, pass_app
from pgembed.cli.options import pop_settings, setting_options
from pgembed.cli.progress import SetupLines
from pgembed.cli.reindex import describe, fill_options, run_backfill, run_options, run_reindex
from pgembed.lifecycle import altertable, indexbuild, models, reindex


@click.group("model")
def model_group() -> None:
    """Add, alter, list and remove models (one vector column and HNSW index each) and their
    full-text indexes (for --hybrid)."""


@model_group.command("add")
@click.argument("name")
@click.option("--table", "table", required=True, help="The table to watch ([schema.]table).")
@click.option(
    "--column",
    "columns",
    required=True,
    multiple=True,
    help="The text column to embed; repeat it to embed several together (joined by a newline).",
)
@click.option("--key", help="Unique key column. Default: the table's single-column primary key.")
@setting_options(alter=False)
@click.option("--fulltext", is_flag=True, help="Also create the index --hybrid needs.")
@click.option(
    "--backfill",
    is_flag=True,
    help="Embed the existing rows now, then build the HNSW index over them: faster than the "
    "daemon inserting each vector into the index (README: Backfills).",
)
@pass_app
def model_add(
    app: App,
    /,
    name: str,
    table: str,
    columns: tuple[str, ...],
    key: str | None,
    fulltext: bool,
    backfill: bool,
    **settings: Any,
) -> None:
    """Register model NAME on a table's text column(s) and queue its existing rows."""
    request = models.AddRequest(
        name, table, columns, key, fulltext=fulltext, index=not backfill, **settings
    )
    with app.connect() as conn:
        spec, queued = models.add(conn, request, url=app.url, reporter=SetupLines())
    terminal.echo(
        f"added model {spec.name}: {spec.model_ref} ({spec.pooling} pooling, {spec.dimensions} "
        f"dimensions) on {spec.qualified_table}.{'+'.join(spec.text_columns)} -> "
        f"{spec.embedding_column}"
        + (f" and {spec.table_schema}.{naming.chunk_table_name(spec)}" if spec.chunked else "")
        + f"; {queued} rows queued"
        + ("" if backfill else " (run `pgembed sync`)")
    )
    click.echo(f"precision {spec.precision}: {spec.precision_note}")
    if backfill:
        run_backfill(app, spec.name)


def _say_waiting(line: str) -> None:
    """A DDL statement timed out on its table lock and will try again: say so on stderr."""
    click.echo(f"pgembed: {line}", err=True)


@model_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def model_list(app: App, as_json: bool) -> None:
    """List registered models."""
    with app.connect() as conn:
        specs = registry.all_models(conn)
    if as_json:
        click.echo(json.dumps([s.as_dict() for s in specs], indent=2))
        return
    if not specs:
        click.echo("no models: add one with `pgembed model add`")
    for s in specs:
        terminal.echo(
            f"{s.name}\t{s.qualified_table}.{'+'.join(s.text_columns)} -> {s.embedding_column}\t"
            f"{s.model_ref}\t{s.pooling}\t{s.dimensions}d"
        )


@model_group.command("remove")
@click.argument("name")
@pass_app
def model_remove(app: App, name: str) -> None:
    """Drop model NAME's column, index, queue and triggers; the table's other data stays."""
    with app.connect() as conn:
        spec = models.remove(conn, name, on_wait=_say_waiting)
    click.echo(f"removed model {spec.name} ({spec.embedding_column} dropped)")


@model_group.command("fulltext")
@click.argument("name")
@pass_app
def model_fulltext(app: App, name: str) -> None:
    """Create model NAME's full-text index (for --hybrid), without blocking writes."""
    with app.connect() as conn:
        spec = models.add_fulltext_index(conn, name, url=app.url, on_wait=_say_waiting)
    click.echo(f"model {spec.name}: full-text index pgembed_{spec.name}_fts is ready")


@model_group.command("alter")
@click.argument("name")
@setting_options(alter=True)
@click.option(
    "--no-wait", is_flag=True, help="Only register the new version; `pgembed reindex` finishes it."
)
@fill_options
@click.pass_obj
def model_alter(app: App, /, name: str, no_wait: bool, **kw: Any) -> None:
    """Record new settings as the next version of model NAME and reindex online into them."""
    change = reindex.Change(**pop_settings(kw))
    with app.connect() as conn:
        if (alone := change.precision_only()) is not None:
            spec = models.alter_precision(conn, name, alone)
            click.echo(f"model {name}: precision {spec.precision}: {spec.precision_note}")
            return
        options = None if no_wait else run_options(kw)  # its device and memory: before anything
        if options is not None:
            indexbuild.check(conn, options.build)
        shadow, queued = reindex.begin(conn, name, change, reporter=SetupLines())
    click.echo(
        f"model {name}: version {shadow.version} ({describe(shadow)}) registered as "
        f"{shadow.name}; {queued} rows queued"
    )
    click.echo(f"precision {shadow.precision}: {shadow.precision_note}")
    if options is not None:
        run_reindex(app, name, options)


@click.command("alter-table")
@click.argument("table")
@click.argument("statement")
@pass_app
def alter_table_cmd(app: App, table: str, statement: str) -> None:
    """Run STATEMENT with the capture triggers of TABLE's models lifted around it, in one
    transaction; the vectors stay.

    For a statement such as ALTER TABLE ... ALTER COLUMN ... TYPE: PostgreSQL refuses to change
    the type of a column a trigger names (a model's key and text columns). Rows whose text the
    statement changes are embedded again."""
    with app.connect() as conn:
        done = altertable.alter_table(conn, table, statement, on_wait=_say_waiting)
    click.echo(
        f"altered {done.schema}.{done.table}; capture triggers made again for model(s) "
        f"{', '.join(done.models)}"
    )
    for name, (old, new) in done.key_types.items():
        click.echo(f"model {name}: key type {old} -> {new}")
    for name, queued in done.requeued.items():
        if queued:
            click.echo(f"model {name}: {queued} rows' text changed: queued to embed again")
