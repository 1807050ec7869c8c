"""`pgembed sync --metrics-port`: one daemon's liveness, readiness and Prometheus metrics on a
small HTTP server of its own, for a container's health check and a Prometheus scrape.

prometheus_client keeps the counters and writes the text format; wsgiref serves them from a
thread (a scrape is rare and short: no event loop, no framework). The worker tells `Health` what
happens (a session up, a fault, a batch); the queue's depth and lag per model are read from the
database at each scrape, as `pgembed status` reads them, so every worker reports the same.
"""

from __future__ import annotations

import json
import logging
import socketserver
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pgembed import db, sqlfiles
from pgembed.catalog import registry
from pgembed.errors import PgembedError

log = logging.getLogger("pgembed.sync")

# Seconds per batch of a worker: a small claim on a GPU to a large one
# of long texts on one slow core.
BATCH_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
SCRAPE_TIMEOUT_MS = 5000  # a scrape's queries stop after this long rather than hang the scraper

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class Health:
    """What the worker reports, read by the HTTP handlers: ready once a session serves, not
    while it reconnects; the counters of what its batches did."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._lock = threading.Lock()
        self._ready = False
        self._why = "starting: connecting and loading models"
        self._since = time.time()
        self.written = Counter(
            "pgembed_rows_embedded", "Rows whose vector this worker wrote.", ["model"],
            registry=registry,
        )  # fmt: skip
        self.skipped = Counter(
            "pgembed_rows_skipped",
            "Keys this worker claimed whose row was gone, blank or changed meanwhile.",
            ["model"],
            registry=registry,
        )
        self.failed = Counter(
            "pgembed_rows_failed",
            "Rows a batch of this worker could not embed or write (an attempt each).",
            ["model"],
            registry=registry,
        )
        self.batch_seconds = Histogram(
            "pgembed_batch_seconds",
            "Seconds per batch: since the previous one's write-back, as batches overlap.",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.rows_per_second = Gauge(
            "pgembed_batch_rows_per_second",
            "Rows per second of this worker's last batch of the model.",
            ["model"],
            registry=registry,
        )

    def serving(self) -> None:
        with self._lock:
            if not self._ready:
                self._ready, self._why, self._since = True, "serving", time.time()

    def fault(self, why: str) -> None:
        with self._lock:
            self._ready, self._why, self._since = False, f"reconnecting: {why}", time.time()

    def batch(self, model: str, written: int, skipped: int, failed: int, seconds: float) -> None:
        self.written.labels(model).inc(written)
        self.skipped.labels(model).inc(skipped)
        self.failed.labels(model).inc(failed)
        if seconds > 0:
            self.batch_seconds.labels(model).observe(seconds)
            self.rows_per_second.labels(model).set((written + skipped + failed) / seconds)

    def state(self) -> tuple[bool, dict[str, Any]]:
        with self._lock:
            return self._ready, {"state": self._why, "since": round(self._since, 3)}


class QueueCollector:
    """Each model's backlog, its oldest entry's age, its failures: read at each scrape."""

    def __init__(self, url: str) -> None:
        self.url = url

    def describe(self) -> Iterable[Metric]:
        return []  # read at collect time only: the models are the catalog's of the moment

    def collect(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily(
            "pgembed_queue_rows", "Keys waiting to be embedded (queue and inbox).", labels=["model"]
        )
        lag = GaugeMetricFamily(
            "pgembed_lag_seconds",
            "Age of the oldest waiting key (0: none).",
            labels=["model"],
        )
        failed = GaugeMetricFamily(
            "pgembed_failures", "Keys in pgembed.failures, given up on.", labels=["model"]
        )
        up = GaugeMetricFamily("pgembed_database_up", "1 if this scrape could read the queues.")
        try:
            with db.connection(self.url) as conn:
                conn.execute("SELECT pg_catalog.set_config('statement_timeout', %s, false)",
                             (str(SCRAPE_TIMEOUT_MS),))  # fmt: skip
                for spec in registry.all_models(conn):
                    stats = conn.execute(
                        sqlfiles.get("lifecycle", "queue_stats"), {"model": spec.name}
                    ).fetchone()
                    if stats is None:
                        continue
                    queued.add_metric([spec.name], float(stats[0]))
                    lag.add_metric([spec.name], float(stats[1] or 0.0))
                    failed.add_metric([spec.name], float(stats[2]))
            up.add_metric([], 1.0)
        except (psycopg.Error, PgembedError, OSError) as exc:  # down, or refused: said, not raised
            log.warning("metrics: cannot read the queues: %s", db.first_line(exc))
            up.add_metric([], 0.0)
            yield up
            return
        yield from (queued, lag, failed, up)


class MetricsServer:
    """`GET /healthz` (the process answers: 200), `GET /readyz` (200 while a session serves,
    else 503 with why), `GET /metrics` (Prometheus text); bound at construction, served from a
    daemon thread by `start`."""

    def __init__(self, url: str, host: str, port: int) -> None:
        self.registry = CollectorRegistry()
        self.health = Health(self.registry)
        self.registry.register(QueueCollector(url))
        self._server = make_server(
            host, port, self._app, server_class=_ThreadingServer, handler_class=_QuietHandler
        )
        self.port = int(self._server.server_port)

    def start(self) -> None:
        threading.Thread(
            target=self._server.serve_forever, name="pgembed-metrics", daemon=True
        ).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _app(self, environ: dict[str, Any], start: StartResponse) -> list[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "")
        if method not in ("GET", "HEAD"):
            return _answer(start, "405 Method Not Allowed", {"error": "GET only"})
        if path == "/healthz":
            return _answer(start, "200 OK", {"status": "ok"})
        if path == "/readyz":
            ready, state = self.health.state()
            return _answer(start, "200 OK" if ready else "503 Service Unavailable", state)
        if path == "/metrics":
            body = generate_latest(self.registry)
            start("200 OK", [("Content-Type", CONTENT_TYPE_LATEST)])
            return [body]
        return _answer(start, "404 Not Found", {"error": "/healthz, /readyz or /metrics"})


def _answer(start: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    start(status, [("Content-Type", "application/json")])
    return [json.dumps(body).encode()]


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape left hanging does not hold the daemon's exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the daemon's log."""
