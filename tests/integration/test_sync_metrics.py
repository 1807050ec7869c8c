"""`pgembed sync --metrics-port`: readiness follows the worker's sessions, the queue's figures
come from the database at each scrape, and a real daemon's counters are scraped during a sync."""

from __future__ import annotations

import json
import re
import signal
import socket
import urllib.error
import urllib.request

import pytest

from daemon_helpers import start_sync, wait_for
from helpers import cli
from pgembed.sync.metrics import MetricsServer


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.read().decode()


def sample(text: str, name: str, model: str | None = None) -> float | None:
    """The value of metric `name` (with label model=`model`) in a Prometheus text page."""
    labels = f'\\{{model="{model}"\\}}' if model else ""
    found = re.search(rf"^{name}{labels} (\S+)$", text, re.MULTILINE)
    return float(found[1]) if found else None


def test_ready_follows_the_sessions_and_the_queue_is_read_at_each_scrape(
    spec: object, db_url: str
) -> None:
    """8 rows queued by the `reviews` fixture's model: the scrape says so; readiness is 503
    until a session serves and again during a fault, with why; other paths and methods are
    refused in JSON."""
    server = MetricsServer(db_url, "127.0.0.1", 0)
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert get(f"{base}/healthz") == (200, '{"status": "ok"}')
        status, body = get(f"{base}/readyz")
        assert status == 503 and json.loads(body)["state"].startswith("starting")
        server.health.serving()
        assert get(f"{base}/readyz")[0] == 200
        server.health.fault("connection refused")
        status, body = get(f"{base}/readyz")
        assert (status, json.loads(body)["state"]) == (503, "reconnecting: connection refused")
        status, page = get(f"{base}/metrics")
        assert status == 200
        assert sample(page, "pgembed_queue_rows", "minilm") == 8
        assert (sample(page, "pgembed_lag_seconds", "minilm") or 0) > 0
        assert sample(page, "pgembed_failures", "minilm") == 0
        assert sample(page, "pgembed_database_up") == 1
        assert get(f"{base}/nothing")[0] == 404
        request = urllib.request.Request(f"{base}/metrics", data=b"", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 405
        refused.value.close()
    finally:
        server.stop()


def test_a_scrape_without_the_database_says_so_and_still_answers() -> None:
    server = MetricsServer("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", "127.0.0.1", 0)
    server.start()
    try:
        status, page = get(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.stop()
    assert status == 200 and sample(page, "pgembed_database_up") == 0


def test_a_daemon_is_scraped_during_its_sync(spec: object, db_url: str) -> None:
    """A real `pgembed sync --metrics-port 0`: its log names the port; ready once it serves;
    its counters and the queue's depth match what it embedded."""
    proc = start_sync(db_url, "--metrics-port", "0", "--poll-seconds", "0.5")
    try:
        assert proc.stderr is not None
        line = ""
        while "metrics on http://" not in line:
            line = proc.stderr.readline()
            assert line, "the daemon ended without naming its metrics port"
        base = re.search(r"(http://\S+?)/? ", line + " ")
        assert base, line
        url = base[1]
        wait_for(lambda: get(f"{url}/readyz")[0] == 200, 120, "the daemon to be ready")
        wait_for(
            lambda: sample(get(f"{url}/metrics")[1], "pgembed_queue_rows", "minilm") == 0,
            120,
            "the queue to drain",
        )
        page = get(f"{url}/metrics")[1]
        assert sample(page, "pgembed_rows_embedded_total", "minilm") == 8
        assert sample(page, "pgembed_rows_failed_total", "minilm") == 0
        assert (sample(page, "pgembed_batch_seconds_count", "minilm") or 0) >= 1
        assert (sample(page, "pgembed_batch_rows_per_second", "minilm") or 0) > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_a_metrics_port_in_use_is_one_line(db_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = cli("--database-url", db_url, "sync", "--once", "--metrics-port", str(port))
    assert result.exit_code != 0
    assert result.output.strip() == (
        f"pgembed: error: --metrics-port: cannot listen on 127.0.0.1:{port}: Address already in use"
    ), result.output
