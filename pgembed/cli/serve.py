"""`pgembed serve`: answer searches over HTTP with the models loaded, until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from functools import partial

import click

from pgembed import defaults
from pgembed.cli.app import App, pass_app, stopping
from pgembed.cli.logs import setup_logging
from pgembed.errors import ConfigError

log = logging.getLogger("pgembed.serve")


@click.command("serve")
@click.option(
    "--host",
    metavar="ADDR",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. The API has no authentication: see docs/serve.md before "
    "binding to another interface.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="0: any free port (the address is printed).",
)
@click.option(
    "--model",
    "model_names",
    multiple=True,
    metavar="NAME",
    help="Serve only these models (repeatable). Default: every model, loaded at start.",
)
@click.option(
    "--allow-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="Answer only requests whose Host is NAME (repeatable), on any address (bound to a "
    "loopback address, loopback's too): a container bound to 0.0.0.0 keeps the DNS rebinding "
    "check (docs/serve.md).",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(1, None),
    default=defaults.SERVE_MAX_IN_FLIGHT,
    show_default=True,
    help="Requests answered at once at most; past it a 503 with Retry-After.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 1024),
    default=defaults.QUERY_BATCH,
    show_default=True,
    help="Query texts encoded in one batch at most (1: one at a time).",
)
@click.option(
    "--batch-wait-ms",
    type=click.FloatRange(0, 1000),
    default=defaults.QUERY_BATCH_WAIT * 1000,
    show_default=True,
    help="Milliseconds an idle encoder waits for more queries to batch with a first one.",
)
@click.option(
    "--statement-timeout",
    type=click.FloatRange(0, defaults.SERVE_STATEMENT_TIMEOUT_MAX),
    default=defaults.SERVE_STATEMENT_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="A search statement running longer is stopped and answered 504 (0: no limit).",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(0.1, 3600),
    default=defaults.SERVE_REQUEST_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="A request's headers, then its body, must each arrive within this long: else 408 and "
    "the connection closed.",
)
@click.option(
    "--stop-timeout",
    type=click.IntRange(1, 3600),
    default=defaults.SERVE_STOP_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="After SIGTERM or SIGINT, requests in flight get this long to finish; one still "
    "running is answered 503.",
)
@click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@pass_app
def serve_cmd(
    app: App,
    host: str,
    port: int,
    model_names: tuple[str, ...],
    allowed_hosts: tuple[str, ...],
    max_in_flight: int,
    batch_size: int,
    batch_wait_ms: float,
    statement_timeout: float,
    request_timeout: float,
    stop_timeout: int,
    log_format: str,
) -> None:
    """Search over HTTP: POST /search, GET /models, GET /healthz, a search page at /.

    Prints `serving http://HOST:PORT` once the models are loaded; one log line per request.
    """
    from pgembed.serve.api import Api
    from pgembed.serve.server import SearchServer

    setup_logging(log_format)
    api = Api(
        app.url,
        model_names,
        max_batch=batch_size,
        max_wait=batch_wait_ms / 1000,
        statement_timeout=statement_timeout,
    )
    try:
        server = SearchServer(
            api,
            host,
            port,
            allowed_hosts=allowed_hosts,
            max_in_flight=max_in_flight,
            body_seconds=request_timeout,
            head_seconds=request_timeout,
            stop_seconds=stop_timeout,
        )
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    stop = threading.Event()
    with stopping(partial(_stop_once, stop)):
        api.warm()  # after binding: a port in use fails before the seconds of loading models
        server.start()
        click.echo(f"serving {server.url}")
        while not stop.wait(1.0):
            pass
        log.info("stopping: a signal came")
        server.stop()
    log.info("stopped")


def _stop_once(stop: threading.Event) -> None:
    """The first SIGINT/SIGTERM is a clean stop (exit 0); a second one ends the process."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    stop.set()
