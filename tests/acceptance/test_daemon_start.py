"""A daemon started before its database is up waits for it, saying so on each try, and serves
it once it answers; `sync --once` still reports the fault at once.

The database "comes up" through a TCP forwarder to the test server: its port is bound but not
listening (a connection is refused, as when PostgreSQL is down), then listens."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from daemon_helpers import embedded_count, wait_for
from helpers import REVIEWS, run_cli
from pgembed import db
from pgembed.lifecycle import models


class Forwarder:
    """127.0.0.1:port to the server of `url`; refuses connections until `listen()`."""

    def __init__(self, url: str) -> None:
        info = conninfo_to_dict(url)
        host, port = str(info.get("host") or "/tmp"), int(info.get("port") or 5432)
        self._upstream: tuple[int, str | tuple[str, int]] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
            if host.startswith("/")
            else (socket.AF_INET, (host, port))
        )
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        user, password = quote(str(info.get("user") or "")), info.get("password")
        secret = f":{quote(str(password))}" if password else ""
        self.url = f"postgresql://{user}{secret}@127.0.0.1:{self.port}/{info['dbname']}"

    def listen(self) -> None:
        self._listener.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            family, address = self._upstream
            server = socket.socket(family)
            server.connect(address)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with closing(source), closing(sink):
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass


@contextmanager
def forwarder(url: str) -> Iterator[Forwarder]:
    f = Forwarder(url)
    try:
        yield f
    finally:
        f.close()


@pytest.fixture
def reviews(db_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE reviews (id integer PRIMARY KEY, body text, stars integer)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO reviews (id, body, stars) VALUES (%s, %s, 3)", REVIEWS)
        with db.connection(db_url) as admin:
            models.add(admin, models.AddRequest("minilm", "reviews", "body", precision="fp32"))
        yield conn


def test_a_daemon_waits_for_its_database_to_come_up(
    reviews: psycopg.Connection, db_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "sync.log"
    with forwarder(db_url) as upstream, log.open("w") as stderr:
        command = ["--database-url", upstream.url, "sync", "--poll-seconds", "0.5"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgembed", *command], stderr=stderr, text=True
        )
        try:

            def waiting() -> bool:
                assert proc.poll() is None, log.read_text()  # the old daemon exited 1 here
                return log.read_text().count("database unavailable") >= 2

            wait_for(waiting, 60, "the daemon to say it waits")
            upstream.listen()  # the database is up
            wait_for(lambda: embedded_count(reviews) == len(REVIEWS), 120, "every row")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    said = log.read_text()
    assert proc.returncode == 0, said
    waits = [line for line in said.splitlines() if "database unavailable" in line]
    assert "Connection refused), retrying in 0.5 s" in waits[0], said
    assert "retrying in 1.0 s" in waits[1], said
    assert "Traceback" not in said


def test_sync_once_reports_a_database_that_is_down_at_once(db_url: str) -> None:
    with forwarder(db_url) as upstream:
        result = run_cli("--database-url", upstream.url, "sync", "--once", timeout=60)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pgembed: error: cannot connect to ")
    assert "Connection refused" in lines[0]
