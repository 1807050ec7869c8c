"""The real `pgembed serve` process: it prints its address once its models are loaded, answers
over HTTP, and stops with exit 0 on SIGTERM or SIGINT."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pgembed import db
from pgembed.catalog import registry
from pgembed.search import planner

START_TIMEOUT = 180  # seconds: loading a model on a busy 2-core machine
STOP_TIMEOUT = 60


@contextmanager
def serve(url: str, log: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`pgembed serve --port 0` and the address it printed; killed on the way out if need be."""
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgembed", "--database-url", url, "serve", "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert proc.stdout is not None
        out = proc.stdout
        lines: queue.Queue[str] = queue.Queue()

        def pump() -> None:
            for line in out:
                lines.put(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            try:
                first = lines.get(timeout=START_TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"no address printed: {log.read_text()}") from None
            assert first.startswith("serving http://127.0.0.1:"), first
            yield proc, first.split()[1]
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=STOP_TIMEOUT)
            reader.join(timeout=STOP_TIMEOUT)  # the pipe ends with the process
            out.close()


def post(url: str, body: object) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode())
    with urllib.request.urlopen(request, timeout=60) as response:
        return response.status, json.loads(response.read())


def test_serve_answers_and_stops_on_sigterm(shop_url: str, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    text = "the battery does not last the day"
    with serve(shop_url, log) as (proc, base):
        status, answer = post(f"{base}/search", {"text": text, "model": "minilm", "k": 5})
        with urllib.request.urlopen(f"{base}/healthz", timeout=60) as response:
            health = json.loads(response.read())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=STOP_TIMEOUT) == 0, log.read_text()
    assert status == 200 and health == {"status": "ok", "models": ["minilm"]}
    with db.connection(shop_url) as conn:
        want = planner.query(conn, registry.get(conn, "minilm"), text, 5)
    assert [hit["key"] for hit in answer["hits"]] == [hit.key for hit in want]
    assert [hit["similarity"] for hit in answer["hits"]] == pytest.approx(
        [hit.similarity for hit in want], abs=1e-6
    )
    lines = log.read_text().splitlines()
    assert any("model minilm ready" in line for line in lines)
    assert any("POST /search 200" in line for line in lines)
    assert lines[-1].endswith("stopped") and "Traceback" not in log.read_text()


def test_a_port_in_use_is_one_line_and_sigint_stops(shop_url: str, tmp_path: Path) -> None:
    with serve(shop_url, tmp_path / "first.log") as (proc, base):
        port = base.rsplit(":", 1)[1]
        taken = subprocess.run(
            [sys.executable, "-m", "pgembed", "--database-url", shop_url, "serve", "--port", port],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=STOP_TIMEOUT) == 0
    assert taken.returncode == 1 and taken.stdout == ""
    assert taken.stderr.strip() == (
        f"pgembed: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
