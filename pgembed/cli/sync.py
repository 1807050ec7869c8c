"""`pgembed sync` (the daemon, or --once) and `pgembed retry`."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING

import click
import psycopg

from pgembed import db, defaults
from pgembed.catalog import registry
from pgembed.cli import terminal
from pgembed.cli.app import App, pass_app, stopping
from pgembed.cli.logs import setup_logging
from pgembed.cli.progress import progress_bar
from pgembed.embedded import server
from pgembed.encode import hardware
from pgembed.errors import ConfigError, DatabaseError
from pgembed.sync import store, worker

if TYPE_CHECKING:
    from pgembed.sync.metrics import Health


@click.command("sync")
@click.option("--once", is_flag=True, help="Drain every queue, then exit.")
@click.option(
    "--model",
    "model_names",
    multiple=True,
    metavar="NAME",
    help="Only these models (repeatable). Default: all.",
)
@click.option(
    "--claim-size",
    type=click.IntRange(1, 10_000),
    help="Keys claimed at once, encoded in length-sorted batches. Default: 256, on a GPU 1024.",
)
@click.option(
    "--lease-seconds",
    type=click.FloatRange(min=1),
    default=defaults.LEASE_SECONDS,
    show_default=True,
    help="How long a claim lasts unrenewed: a live worker renews its claims every third of it, "
    "a dead worker's come back to the queue after it.",
)
@click.option(
    "--poll-seconds",
    type=click.FloatRange(min=0.1),
    default=defaults.POLL_SECONDS,
    show_default=True,
    help="Poll this often even without a NOTIFY.",
)
@click.option(
    "--max-attempts", type=click.IntRange(min=1), default=defaults.MAX_ATTEMPTS, show_default=True
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option(
    "--device",
    type=click.Choice(hardware.DEVICES),
    default="auto",
    show_default=True,
    help="Where to encode: auto picks a CUDA GPU, else an Apple GPU (mps), else the CPU.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Serve GET /healthz, /readyz and Prometheus /metrics on this port (0: any free port, "
    "logged). Default: off.",
)
@click.option(
    "--metrics-host",
    metavar="ADDR",
    default="127.0.0.1",
    show_default=True,
    help="Address for --metrics-port: 0.0.0.0 for a scraper in another container.",
)
@pass_app
def sync_cmd(
    app: App,
    once: bool,
    model_names: tuple[str, ...],
    claim_size: int | None,
    lease_seconds: float,
    poll_seconds: float,
    max_attempts: int,
    log_format: str,
    device: str,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Embed queued rows and write their vectors; runs until SIGINT/SIGTERM unless --once."""
    quiet = once and sys.stderr.isatty()
    setup_logging(log_format, quiet=quiet)
    device = hardware.resolve_device(device)
    options = worker.Options(
        models=model_names,
        claim_size=claim_size or defaults.claim_size(device),
        lease_seconds=lease_seconds,
        poll_seconds=poll_seconds,
        max_attempts=max_attempts,
        once=once,
        device=device,
    )
    url = app.url
    with _metrics(url, metrics_host, metrics_port) as health:
        names, total = _first_contact(app, model_names, once)
        with progress_bar(total, "embedding", enabled=once) as advance:
            # reached: the check above got through, so a fault from here on is a restart to ride
            # out. On the embedded default, a server stopped under the daemon (a crash) is
            # started again.
            revive = server.revive if app.explicit_url is None else None
            w = worker.Worker(
                url,
                options,
                on_progress=lambda _model, n: advance(n),
                reached=True,
                revive=revive,
                health=health,
            )
            with stopping(partial(_finish, w)):
                stats = w.run()
    click.echo(
        f"synced: {stats.written} written, {stats.skipped} skipped, {stats.failed} failed",
        err=not once,
    )
    if once:
        for name, reason in w.broken.items():
            if quiet:  # else the log said it already
                terminal.echo(f"model {name} skipped: {reason}", err=True)
        with app.connect() as conn:
            left = store.backlog(conn, [n for n in names if n not in w.broken])
        for line in backlog_lines(left, stopped=w.stop_event.is_set()):
            click.echo(line)


def backlog_lines(left: store.Backlog, *, stopped: bool = False) -> list[str]:
    """What `sync --once` left in the queue, by why: only a retry follows a failure. `stopped`:
    a signal ended it before the queue was empty, so the rows waiting were there before."""
    lines = []
    if left.retrying:
        lines.append(f"{left.retrying} rows wait for a retry after a failure: see `pgembed status`")
    if left.orphaned:
        lines.append(
            f"{left.orphaned} rows are leased by a worker that stopped (killed?): they are "
            f"ready again when its lease ends, in {left.orphaned_seconds:.0f} s"
        )
    if left.leased:
        lines.append(f"{left.leased} rows are being embedded by another running worker")
    if left.held:
        lines.append(
            f"{left.held} rows were locked by another transaction when their vectors were "
            "written: `pgembed sync --once` again when it has ended (they are ready again in "
            f"{left.held_seconds:.0f} s)"
        )
    if left.waiting and stopped:
        lines.append(f"stopped: {left.waiting} rows still queued: `pgembed sync --once` again")
    elif left.waiting:
        lines.append(f"{left.waiting} rows came in meanwhile: `pgembed sync --once` again")
    return lines


def _first_contact(
    app: App, model_names: tuple[str, ...], once: bool
) -> tuple[tuple[str, ...], int | None]:
    """The models to serve (each one checked) and, with --once, the rows queued for them.

    A daemon started before its database is up (a boot, a compose file) waits for it, saying so
    on each try; --once reports the fault at once (its caller, a script or cron, decides), and
    so does any daemon for a fault that waiting will not heal (authentication, no such database,
    a missing schema)."""
    backoff = worker.Backoff(defaults.MAX_BACKOFF_SECONDS)
    while True:
        try:
            with app.connect() as conn:
                names = model_names or tuple(s.name for s in registry.all_models(conn))
                for name in names:
                    registry.get(conn, name)
                return names, store.queued_count(conn, names) if once else None
        except (DatabaseError, psycopg.OperationalError) as exc:
            if once or worker.permanent(exc):
                raise
            delay = backoff.next()
            logging.getLogger("pgembed.sync").warning(
                "database unavailable (%s), retrying in %.1f s", db.first_line(exc), delay
            )
            time.sleep(delay)


@contextmanager
def _metrics(url: str, host: str, port: int | None) -> Iterator[Health | None]:
    """With a port, the metrics server from before the first connection (a daemon waiting for
    its database is alive, not ready) to the exit; without one, nothing (nor its import)."""
    if port is None:
        yield None
        return
    from pgembed.sync.metrics import MetricsServer

    try:
        metrics = MetricsServer(url, host, port)
    except OSError as exc:
        said = exc.strerror or exc
        raise ConfigError(f"--metrics-port: cannot listen on {host}:{port}: {said}") from None
    metrics.start()
    shown = f"[{host}]" if ":" in host else host
    logging.getLogger("pgembed.sync").info(
        "metrics on http://%s:%d/ (/healthz, /readyz, /metrics)", shown, metrics.port
    )
    try:
        yield metrics.health
    finally:
        metrics.stop()


def _finish(w: worker.Worker) -> None:
    logging.getLogger("pgembed.sync").info("signal: finishing the current batch")
    w.stop()


@click.command("retry")
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
    with app.connect() as conn:
        names = list(model_names) or [s.name for s in registry.all_models(conn)]
        for name in names:
            registry.get(conn, name)
        count = store.retry_failures(conn, names)
    click.echo(f"requeued {count} failed rows")
