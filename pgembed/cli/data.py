"""Commands that put things into the database: migrate, load."""

from __future__ import annotations

from pathlib import Path

import click

from pgembed import loader, migrate
from pgembed.cli.app import App, pass_app
from pgembed.cli.progress import progress_bar


@click.command("migrate")
@pass_app
def migrate_cmd(app: App) -> None:
    """Install or upgrade the pgembed schema (and the vector extension)."""
    with app.connect(require_schema=False) as conn:
        applied = migrate.migrate(conn)
    if applied:
        for migration in applied:
            click.echo(f"applied {migration.filename}")
    else:
        click.echo("the pgembed schema is up to date")


@click.command("load")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--table", required=True, help="The table to create or fill ([schema.]table).")
@click.option("--key", help="Key column (primary key of a new table). Default: `_id`, else `id`.")
@click.option(
    "--text-columns", help="Join these fields with a space into the --into column, e.g. title,text."
)
@click.option(
    "--into", default="text", show_default=True, help="The column that receives --text-columns."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "jsonl", "csv"]),
    default="auto",
    show_default=True,
)
@click.pass_obj
def load_cmd(
    app: App, path: Path, table: str, key: str | None, text_columns: str | None, into: str, fmt: str
) -> None:
    """Create or fill a table from JSON lines or CSV (gzip allowed); existing keys are skipped."""
    request = loader.LoadRequest(
        path=path,
        table=table,
        key=key,
        text_columns=tuple(c.strip() for c in text_columns.split(",")) if text_columns else (),
        into=into,
        format=fmt,
    )
    with app.connect() as conn, progress_bar(None, "loading") as advance:
        result = loader.load(conn, request, advance)
    click.echo(
        f"{'created' if result.created else 'filled'} {result.table}: {result.read} records read, "
        f"{result.inserted} inserted, {result.skipped} skipped (key already there)"
    )
