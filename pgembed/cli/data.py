"""Commands that put things into the database: migrate, load."""

from __future__ import annotations

from pathlib import Path

import click

from pgembed import columntypes, loader, migrate, roles
from pgembed.cli.app import App, pass_app
from pgembed.cli.progress import progress_bar
from pgembed.lifecycle import setup


@click.command("migrate")
@click.option(
    "--create-roles",
    is_flag=True,
    help="Also create the NOLOGIN roles pgembed_daemon and pgembed_reader, with their grants.",
)
@pass_app
def migrate_cmd(app: App, create_roles: bool) -> None:
    """Install or upgrade the pgembed schema (and the vector extension)."""
    defined: list[migrate.Definition] = []
    with app.connect(require_schema=False) as conn:
        applied = migrate.migrate(conn, create_roles=create_roles, on_define=defined.append)
        guarded = setup.guard_older_models(conn)
    for filename in [m.filename for m in applied] + [d.filename for d in defined]:
        click.echo(f"applied {filename}")
    for line in guarded:
        click.echo(line)
    if not applied and not defined:
        click.echo("the pgembed schema is up to date")
    if create_roles:
        click.echo(f"roles {roles.DAEMON} and {roles.READER} are ready: see README, Roles")


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
@click.option(
    "--types",
    help="Column types of a new table, e.g. rating=int,score=float: text, int (bigint), "
    "float (double precision), bool, date, timestamp, timestamptz. Default: inferred.",
)
@click.pass_obj
def load_cmd(
    app: App,
    path: Path,
    table: str,
    key: str | None,
    text_columns: str | None,
    into: str,
    fmt: str,
    types: str | None,
) -> None:
    """Create or fill a table from JSON lines or CSV (gzip allowed); existing keys are skipped.

    A new table's columns are typed from the data: bigint, double precision, boolean, date,
    timestamp or timestamptz where every value of the column is one (empty is NULL), else text.
    """
    request = loader.LoadRequest(
        path=path,
        table=table,
        key=key,
        text_columns=tuple(c.strip() for c in text_columns.split(",")) if text_columns else (),
        into=into,
        format=fmt,
        types=columntypes.parse_types(types),
    )
    with app.connect() as conn, progress_bar(None, "loading") as advance:
        result = loader.load(conn, request, advance)
    click.echo(
        f"{'created' if result.created else 'filled'} {result.table}: {result.read} records read, "
        f"{result.inserted} inserted, {result.skipped} skipped "
        "(key already in the table, or earlier in the file)"
    )
    if result.types:
        click.echo("columns: " + ", ".join(f"{c} {t}" for c, t in result.types.items()))
