"""The `pgembed` command line: thin click commands; the work happens in the modules they call."""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

import click
import psycopg

from pgembed import config, db, migrate
from pgembed.catalog import registry
from pgembed.cli import lifecycle
from pgembed.cli.logs import setup_logging
from pgembed.cli.progress import progress_bar
from pgembed.encode import batches, hardware, precision
from pgembed.errors import PgembedError
from pgembed.lifecycle import models, status
from pgembed.search import helpers
from pgembed.sync import worker

F = TypeVar("F", bound=Callable[..., Any])


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


@main.command("migrate")
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


@main.group("model")
def model_group() -> None:
    """Add, list and remove models (one vector column and HNSW index each)."""


@model_group.command("add")
@click.argument("name")
@click.option("--table", "table", required=True, help="The table to watch ([schema.]table).")
@click.option("--column", required=True, help="The text column to embed.")
@click.option("--key", help="Unique key column. Default: the table's single-column primary key.")
@click.option(
    "--model",
    "model_ref",
    default="all-MiniLM-L6-v2",
    show_default=True,
    help="sentence-transformers checkpoint: a known name, a local directory or a hub id.",
)
@click.option(
    "--pooling",
    type=click.Choice(registry.POOLINGS),
    help="Pooling of token vectors. Default: the checkpoint's own.",
)
@click.option("--no-normalize", is_flag=True, help="Keep vectors unnormalised.")
@click.option(
    "--max-seq-length",
    type=click.IntRange(min=1),
    help="Truncate texts to this many word pieces. Default: the checkpoint's own.",
)
@click.option("--query-prefix", default="", help="Text put before every query.")
@click.option("--document-prefix", default="", help="Text put before every embedded row.")
@click.option("--fulltext", is_flag=True, help="Also create the index --hybrid needs.")
@click.option(
    "--precision",
    "precision_",
    type=click.Choice(precision.REQUESTS),
    default="auto",
    show_default=True,
    help="Arithmetic of the encoder; kept only if its vectors agree with fp32 (cosine >= 0.999).",
)
@pass_app
def model_add(
    app: App,
    name: str,
    table: str,
    column: str,
    key: str | None,
    model_ref: str,
    pooling: str | None,
    no_normalize: bool,
    max_seq_length: int | None,
    query_prefix: str,
    document_prefix: str,
    fulltext: bool,
    precision_: str,
) -> None:
    """Register model NAME on a table's text column and queue its existing rows."""
    request = models.AddRequest(
        name=name,
        table=table,
        column=column,
        key=key,
        model_ref=model_ref,
        pooling=pooling,
        normalize=not no_normalize,
        max_seq_length=max_seq_length,
        query_prefix=query_prefix,
        document_prefix=document_prefix,
        fulltext=fulltext,
        precision=precision_,
    )
    with app.connect() as conn:
        spec, queued = models.add(conn, request)
    click.echo(
        f"added model {spec.name}: {spec.model_ref} ({spec.pooling} pooling, {spec.dimensions} "
        f"dimensions) on {spec.qualified_table}.{spec.text_column} -> {spec.embedding_column}; "
        f"{queued} rows queued (run `pgembed sync`)"
    )
    click.echo(f"precision {spec.precision}: {spec.precision_note}")


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
        click.echo(
            f"{s.name}\t{s.qualified_table}.{s.text_column} -> {s.embedding_column}\t"
            f"{s.model_ref}\t{s.pooling}\t{s.dimensions}d"
        )


@model_group.command("remove")
@click.argument("name")
@pass_app
def model_remove(app: App, name: str) -> None:
    """Drop model NAME's column, index, queue and triggers; the table's other data stays."""
    with app.connect() as conn:
        spec = models.remove(conn, name)
    click.echo(f"removed model {spec.name} ({spec.embedding_column} dropped)")


@model_group.command("fulltext")
@click.argument("name")
@pass_app
def model_fulltext(app: App, name: str) -> None:
    """Create model NAME's full-text index (for --hybrid), without blocking writes."""
    with app.connect() as conn:
        spec = models.fulltext(conn, name)
    click.echo(f"model {spec.name}: full-text index pgembed_{spec.name}_fts is ready")


@main.command("sync")
@click.option("--once", is_flag=True, help="Drain every queue, then exit.")
@click.option(
    "--model",
    "model_names",
    multiple=True,
    metavar="NAME",
    help="Only these models (repeatable). Default: all.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 10_000),
    help="Keys claimed at once, encoded in length-sorted batches. Default: 256, on a GPU 1024.",
)
@click.option(
    "--lease-seconds",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="How long a claim lasts before another worker may take it over.",
)
@click.option(
    "--poll-seconds",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    help="Poll this often even without a NOTIFY.",
)
@click.option("--max-attempts", type=click.IntRange(min=1), default=5, show_default=True)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option(
    "--device",
    type=click.Choice(hardware.DEVICES),
    default="auto",
    show_default=True,
    help="Where to encode: auto picks a CUDA GPU when one is visible.",
)
@pass_app
def sync_cmd(
    app: App,
    once: bool,
    model_names: tuple[str, ...],
    batch_size: int | None,
    lease_seconds: float,
    poll_seconds: float,
    max_attempts: int,
    log_format: str,
    device: str,
) -> None:
    """Embed queued rows and write their vectors; runs until SIGINT/SIGTERM unless --once."""
    setup_logging(log_format, quiet=once and sys.stderr.isatty())
    device = hardware.resolve_device(device)
    options = worker.Options(
        models=model_names,
        batch_size=batch_size or batches.default_claim_size(device),
        lease_seconds=lease_seconds,
        poll_seconds=poll_seconds,
        max_attempts=max_attempts,
        once=once,
        device=device,
    )
    url = app.url
    with app.connect() as conn:
        names = model_names or tuple(s.name for s in registry.all_models(conn))
        for name in names:
            registry.get(conn, name)
        total = worker.queued_count(conn, names) if once else None
    with progress_bar(total, "embedding", enabled=once) as advance:
        w = worker.Worker(url, options, on_progress=lambda _model, n: advance(n))
        _stop_on_signals(w.stop)
        stats = w.run()
    click.echo(
        f"synced: {stats.written} written, {stats.skipped} skipped, {stats.failed} failed",
        err=not once,
    )
    if once:
        with app.connect() as conn:
            waiting = worker.queued_count(conn, names)
        if waiting:
            click.echo(f"{waiting} rows wait for a retry after a failure: see `pgembed status`")


def _stop_on_signals(stop: Callable[[], None]) -> None:
    def handler(signum: int, _frame: object) -> None:
        logging.getLogger("pgembed.sync").info("signal %d: finishing the current batch", signum)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


@main.command("query")
@click.argument("text", required=False)
@click.option("--model", "model_name", required=True, help="The model to search with.")
@click.option("-k", "k", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--filter", "filter_json", metavar="JSON", help='Only rows matching {"col": value}.')
@click.option("--similar-to", metavar="KEY", help="Rows like this row (instead of TEXT).")
@click.option("--hybrid", is_flag=True, help="Fuse with a full-text ranking of TEXT.")
@click.option("--ef-search", type=click.IntRange(1, 1000), help="hnsw.ef_search for this query.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_app
def query_cmd(
    app: App,
    text: str | None,
    model_name: str,
    k: int,
    filter_json: str | None,
    similar_to: str | None,
    hybrid: bool,
    ef_search: int | None,
    as_json: bool,
) -> None:
    """Print the K rows nearest to TEXT (or to the row --similar-to KEY)."""
    request = helpers.Request(
        text=text,
        k=k,
        filter=helpers.parse_filter(filter_json),
        similar_to=similar_to,
        hybrid=hybrid,
        ef_search=ef_search,
    )
    with app.connect() as conn:
        spec = registry.get(conn, model_name)
        hits = helpers.run(conn, spec, request)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(h) for h in hits]))
        return
    for h in hits:
        score = f"{h.similarity:.3f}" if isinstance(h, helpers.Hit) else f"{h.score:.4f}"
        click.echo(f"{h.key}\t{score}\t{snippet(h.text)}")


def snippet(text: str, width: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


@main.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True)
@pass_app
def status_cmd(app: App, as_json: bool, watch: bool, interval: float) -> None:
    """Per model: rows embedded, backlog, lag, failures, throughput and live workers."""
    with app.connect() as conn:
        while True:
            report = status.all_status(conn)
            text = json.dumps(report, indent=2) if as_json else _status_text(conn, report)
            if watch:
                click.clear()
            click.echo(text)
            if not watch:
                return
            time.sleep(interval)


def _status_text(conn: psycopg.Connection, report: list[dict[str, Any]]) -> str:
    if not report:
        return "no models: add one with `pgembed model add`"
    lines = []
    for m in report:
        lines.append(
            f"{m['name']}: {m['model']} ({m['pooling']}, {m['dimensions']}d) on "
            f"{m['table']}.{m['column']}\n"
            f"  embedded {m['rows_embedded']}/{m['rows_total']}  queued {m['queued']}  "
            f"lag {m['lag_seconds']:.1f}s  failed {m['failed']}  truncated {m['truncated']}  "
            f"{m['rows_per_second']:.1f} rows/s  workers {len(m['workers'])}\n"
            f"  precision {m['precision']}: {m['precision_note']}"
        )
        if m.get("reindex"):
            lines.append(lifecycle.reindex_line(m["name"], m["reindex"]))
    failed = status.failures(conn)
    if failed:
        lines.append("recent failures (`pgembed retry` requeues them):")
        lines += [
            f"  {f['model']} key={f['key']} attempts={f['attempts']}: {f['error']}" for f in failed
        ]
    return "\n".join(lines)


@main.command("retry")
@click.option(
    "--model",
    "model_names",
    multiple=True,
    metavar="NAME",
    help="Only these models (repeatable). Default: all.",
)
@pass_app
def retry_cmd(app: App, model_names: tuple[str, ...]) -> None:
    """Move failed rows back to the queue."""
    from pgembed.sync import queue

    with app.connect() as conn:
        names = list(model_names) or [s.name for s in registry.all_models(conn)]
        for name in names:
            registry.get(conn, name)
        count = queue.retry_failures(conn, names)
    click.echo(f"requeued {count} failed rows")


@main.command("demo")
@pass_app
def demo_cmd(app: App) -> None:
    """Load a sample `reviews` table, embed it with two poolings and compare their answers."""
    from pgembed import demo

    demo.run(app.url, click.echo)


model_group.add_command(lifecycle.model_alter)
for _command in lifecycle.COMMANDS:
    main.add_command(_command)

__all__ = ["config", "main"]
