"""e: what change capture costs a bulk load (100k rows), with and without pgembed's triggers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from bench.env import Database, generated_corpus, median, timed
from pgembed.lifecycle import models


@dataclass(frozen=True)
class Capture:
    rows: int
    method: str
    without_s: float
    with_s: float

    @property
    def ratio(self) -> float:
        return self.with_s / self.without_s


Row = tuple[int, str, int, str]
_COLUMNS = "id, product, rating, body"


def _rows(n: int) -> list[Row]:
    """Review rows as an application stores them: a product, a rating, a review of ~200 chars."""
    texts = generated_corpus(n, seed=3)
    return [(i, f"product {i % 997}", 1 + i % 5, text) for i, text in enumerate(texts, 1)]


def _loads(rows: list[Row]) -> dict[str, Callable[[psycopg.Connection], None]]:
    def insert_select(conn: psycopg.Connection) -> None:
        conn.execute(f"INSERT INTO bulk ({_COLUMNS}) SELECT {_COLUMNS} FROM bulk_source")

    def multi_row(conn: psycopg.Connection) -> None:
        for start in range(0, len(rows), 1000):
            chunk = rows[start : start + 1000]
            values = ", ".join(["(%s, %s, %s, %s)"] * len(chunk))
            conn.execute(
                f"INSERT INTO bulk ({_COLUMNS}) VALUES {values}",  # type: ignore[arg-type]
                [v for row in chunk for v in row],
            )

    def copy(conn: psycopg.Connection) -> None:
        with conn.cursor() as cur, cur.copy(f"COPY bulk ({_COLUMNS}) FROM STDIN") as c:
            for row in rows:
                c.write_row(row)

    return {"INSERT ... SELECT": insert_select, "multi-row INSERT": multi_row, "COPY": copy}


def _create(conn: psycopg.Connection, table: str) -> None:
    conn.execute(
        f"CREATE TABLE {table} (id integer PRIMARY KEY, product text NOT NULL, "  # type: ignore[arg-type]
        "rating integer NOT NULL, body text NOT NULL)"
    )


def _prepare(conn: psycopg.Connection, triggers: bool) -> None:
    conn.execute("DROP TABLE IF EXISTS bulk")
    conn.execute("DELETE FROM pgembed.models WHERE name = 'bulk'")
    conn.execute("DELETE FROM pgembed.queue WHERE model = 'bulk'")
    conn.execute("DELETE FROM pgembed.inbox WHERE model = 'bulk'")
    _create(conn, "bulk")
    models.add(conn, models.AddRequest("bulk", "bulk", "body"))
    if not triggers:  # same table, column and index: only the capture is missing
        conn.execute("ALTER TABLE bulk DISABLE TRIGGER USER")
    conn.execute("CHECKPOINT")


def measure(database: Database, count: int, repeats: int) -> list[Capture]:
    results = []
    conn = database.connect()
    rows = _rows(count)
    conn.execute("DROP TABLE IF EXISTS bulk_source")
    _create(conn, "bulk_source")
    with conn.cursor() as cur, cur.copy(f"COPY bulk_source ({_COLUMNS}) FROM STDIN") as c:
        for row in rows:
            c.write_row(row)
    for method, load in _loads(rows).items():
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeats):
            for triggers in (False, True):  # interleaved, so drift hits both alike
                _prepare(conn, triggers)
                times[triggers].append(timed(lambda load=load: load(conn)))  # type: ignore[misc]
        queued = conn.execute("SELECT count(*) FROM pgembed.inbox WHERE model = 'bulk'").fetchone()
        assert queued == (count,), f"capture queued {queued} of {count}"
        results.append(Capture(count, method, median(times[False]), median(times[True])))
    _prepare(conn, False)
    conn.execute("DROP TABLE bulk, bulk_source")
    conn.execute("DELETE FROM pgembed.models WHERE name = 'bulk'")
    conn.close()
    return results
