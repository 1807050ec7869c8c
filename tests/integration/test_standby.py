"""Searches from a hot standby (docs/scaling.md): a real streaming replica made with the embedded
server's own pg_basebackup. The SQL helpers, Client and `pgembed serve` work on it with a
read-only URL; `pgembed sync` refuses it in one line and works on the primary, whose writes the
standby then serves.

The primary is a cluster of its own (initdb in a temporary directory), so the session's server
keeps its settings: replication needs a `replication` line in pg_hba.conf."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from clusters import pg, server_dir, start

from helpers import REVIEWS, cli, post_json, with_database
from pgembed import Client, db, migrate
from pgembed.catalog import registry
from pgembed.embedded import access
from pgembed.lifecycle import models
from pgembed.search import planner
from pgembed.serve.api import Api
from pgembed.serve.server import SearchServer
from pgembed.sync import worker

DATABASE = "shop"


@dataclass(frozen=True)
class Pair:
    primary: str  # URLs of database DATABASE
    standby: str


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    primary_dir, standby_dir = server_dir(), server_dir()
    started: list[Path] = []
    try:
        pg("initdb", "-D", str(primary_dir), *access.INITDB_OPTIONS)
        access.write_auth_files(primary_dir)
        with (primary_dir / "pg_hba.conf").open("a") as hba:  # pg_basebackup's connection
            hba.write(f"local replication all peer map={access.AUTH_MAP}\n")
        primary = start(primary_dir)
        started.append(primary_dir)
        with psycopg.connect(primary, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        primary = with_database(primary, DATABASE)
        with db.connection(primary) as conn:
            migrate.migrate(conn)
            conn.execute("CREATE TABLE reviews (id integer PRIMARY KEY, body text)")
            conn.cursor().executemany("INSERT INTO reviews VALUES (%s, %s)", REVIEWS)
            models.add(conn, models.AddRequest("minilm", "reviews", "body", precision="fp32"))
        worker.Worker(primary, worker.Options(once=True)).run()
        # a streaming replica of it, as an operator makes one: -R writes standby.signal and
        # primary_conninfo (the primary's socket)
        pg(
            "pg_basebackup",
            "-D",
            str(standby_dir),
            "-R",
            "-X",
            "stream",
            "-h",
            str(primary_dir),
            "-U",
            "postgres",
            "-c",
            "fast",  # checkpoint now, not spread over minutes
        )
        for lock in standby_dir.glob(".s.PGSQL.*.lock"):  # the primary's socket lock, copied
            lock.unlink()
        standby = start(standby_dir)
        started.append(standby_dir)
        yield Pair(primary, with_database(standby, DATABASE))
    finally:
        for pgdata in reversed(started):
            pg("pg_ctl", "-D", str(pgdata), "-m", "immediate", "stop")
        for pgdata in (primary_dir, standby_dir):
            shutil.rmtree(pgdata, ignore_errors=True)


def _replayed(pair: Pair) -> None:
    """Wait until the standby has replayed everything the primary wrote so far."""
    with db.connection(pair.primary) as conn:
        lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
    with db.connection(pair.standby) as conn:
        for _ in range(300):
            row = conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [str(lsn)]
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.1)
    raise AssertionError("the standby did not catch up in 30 s")


def test_it_is_a_read_only_standby(pair: Pair) -> None:
    with db.connection(pair.standby) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO reviews VALUES (100, 'no')")


def test_sql_helpers_and_client_search_the_standby(pair: Pair) -> None:
    with Client(pair.primary) as primary, Client(pair.standby) as standby:
        for text in ("the battery dies fast", "friendly support"):
            assert standby.search("minilm", text, k=5) == primary.search("minilm", text, k=5)
        assert standby.similar("minilm", 1, k=3) == primary.similar("minilm", 1, k=3)
    with db.connection(pair.standby) as conn:
        rows = conn.execute("SELECT key FROM pgembed.similar('minilm', '1', 3)").fetchall()
        query = conn.execute("SELECT embedding_minilm FROM reviews WHERE id = 2").fetchone()
        found = conn.execute(
            "SELECT key FROM pgembed.search('minilm', %s, 1)",
            [query[0]],  # type: ignore[index]
        ).fetchall()
    assert len(rows) == 3 and "1" not in [r[0] for r in rows]
    assert found == [("2",)]


def test_serve_answers_from_the_standby(pair: Pair) -> None:
    api = Api(pair.standby)
    api.warm()
    served = SearchServer(api, "127.0.0.1", 0)
    served.start()
    try:
        status, answer = post_json(f"{served.url}/search", {"text": "battery", "model": "minilm"})
    finally:
        served.stop()
    assert status == 200, answer
    with db.connection(pair.primary) as conn:
        want = planner.query(conn, registry.get(conn, "minilm"), "battery")
    assert [h["key"] for h in answer["hits"]] == [h.key for h in want]


def test_sync_refuses_the_standby_and_serves_the_primary(pair: Pair) -> None:
    for args in (("sync", "--once"), ("sync",)):
        result = cli("--database-url", pair.standby, *args)
        assert result.exit_code != 0
        assert "read-only hot standby" in result.output and "primary" in result.output
        assert "Traceback" not in result.output
    with db.connection(pair.primary) as conn:
        conn.execute("INSERT INTO reviews VALUES (100, 'The kettle boils in a minute, quietly.')")
    assert cli("--database-url", pair.primary, "sync", "--once").exit_code == 0
    _replayed(pair)
    with Client(pair.standby) as standby:
        assert standby.search("minilm", "a quiet kettle", k=1)[0].key == 100
