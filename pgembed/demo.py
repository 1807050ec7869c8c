"""`pgembed demo`: a sample reviews table, two poolings of one checkpoint, answers side by side."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from pgembed import db, migrate, samples
from pgembed.catalog import registry
from pgembed.cli.progress import progress_bar
from pgembed.lifecycle import models
from pgembed.search import helpers
from pgembed.sync import store, worker

TABLE = "reviews"
MODELS = (("minilm", "mean"), ("minilm_cls", "cls"))
QUERIES = (
    "phone dies before the end of the day",
    "crisp sweet fruit",
    "the Apple charger stopped working",
    "package showed up late and damaged",
    "blocks out noise on the train",
)

_CREATE = """
CREATE TABLE IF NOT EXISTS reviews (
    id       integer PRIMARY KEY,
    product  text NOT NULL,
    category text NOT NULL,
    rating   integer NOT NULL CHECK (rating BETWEEN 1 AND 5),
    text     text NOT NULL
)
"""


def load(conn: psycopg.Connection) -> int:
    """Create and fill the table; rows already there are left alone. Returns rows inserted."""
    with conn.transaction():
        conn.execute(_CREATE)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO reviews (id, product, category, rating, text) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                samples.reviews(),
            )
            return cur.rowcount


def run(url: str, echo: Callable[[str], None]) -> None:
    with db.connection(url) as conn:
        for migration in migrate.migrate(conn):
            echo(f"applied migration {migration.filename}")
    with db.connection(url) as conn:  # reconnect: pgvector's types exist now
        inserted = load(conn)
        echo(f"reviews table: {inserted} sample rows inserted")
        for name, pooling in MODELS:
            if not registry.exists(conn, name):
                models.add(conn, models.AddRequest(name, TABLE, "text", pooling=pooling))
                echo(f"added model {name} (all-MiniLM-L6-v2, {pooling} pooling)")
        total = store.queued_count(conn, [name for name, _ in MODELS])
    with progress_bar(total, "embedding") as advance:
        options = worker.Options(models=tuple(n for n, _ in MODELS), once=True)
        stats = worker.Worker(url, options, on_progress=lambda _m, n: advance(n)).run()
    echo(f"synced: {stats.written} vectors written\n")
    with db.connection(url) as conn:
        specs = [registry.get(conn, name) for name, _ in MODELS]
        for text in QUERIES:
            echo(f'query: "{text}"')
            columns = [helpers.query(conn, spec, text, k=3) for spec in specs]
            echo(f"  {'minilm (mean pooling)':<58}  minilm_cls (CLS pooling)")
            for mean_hit, cls_hit in zip(*columns, strict=False):
                echo(f"  {_cell(mean_hit)}  {_cell(cls_hit)}")
            echo("")
    echo(
        "Mean pooling is what all-MiniLM-L6-v2 was trained for; a BERT [CLS] vector of the same "
        'checkpoint ranks by surface features.\nTry: pgembed query "battery drains fast" '
        "--model minilm"
    )


def _cell(hit: helpers.Hit, width: int = 58) -> str:
    text = " ".join(hit.text.split())
    body = f"{hit.similarity:.2f} {text}"
    return body if len(body) <= width else body[: width - 1] + "…"
