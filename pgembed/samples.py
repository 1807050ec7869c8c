"""The sample reviews shipped with pgembed (data/reviews.csv): the demo's table, the tests' shop,
and the texts a precision is checked on when a table has too few of its own."""

from __future__ import annotations

import csv
from importlib import resources

import psycopg
from psycopg import sql

Review = tuple[int, str, str, int, str]  # id, product, category, rating, text


def reviews() -> list[Review]:
    with resources.files("pgembed").joinpath("data/reviews.csv").open(encoding="utf-8") as f:
        return [
            (int(r["id"]), r["product"], r["category"], int(r["rating"]), r["text"])
            for r in csv.DictReader(f)
        ]


def texts() -> list[str]:
    return [review[-1] for review in reviews()]


_CREATE = """
CREATE TABLE IF NOT EXISTS {} (
    id       integer PRIMARY KEY,
    product  text NOT NULL,
    category text NOT NULL,
    rating   integer NOT NULL CHECK (rating BETWEEN 1 AND 5),
    text     text NOT NULL
)
"""


def load(conn: psycopg.Connection, schema: str, table: str) -> int:
    """Create `schema.table` if missing and fill it with the sample reviews; rows already there
    are left alone. Returns the rows inserted."""
    name = sql.Identifier(schema, table)
    with conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL(_CREATE).format(name))
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {} (id, product, category, rating, text) "
                    "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING"
                ).format(name),
                reviews(),
            )
            return cur.rowcount
