"""Benchmark plumbing: a fresh database on the embedded server (or a given URL) and a corpus."""

from __future__ import annotations

import csv
import gzip
import os
import random
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psycopg

from pgembed import db, migrate
from tests.helpers import database, database_name

_SUBJECTS = [
    "The battery",
    "This charger",
    "The screen",
    "Delivery",
    "The headphones",
    "The app",
    "Customer support",
    "The laptop",
    "These apples",
    "The speaker",
    "The cable",
    "The camera",
    "The keyboard",
    "The kettle",
    "The power bank",
]
_VERDICTS = [
    "works better than I expected",
    "stopped working after a week",
    "is fine for the price",
    "drains far too quickly",
    "arrived broken and scratched",
    "is the best purchase I made this year",
    "gets uncomfortably hot while charging",
    "feels cheap but does the job",
    "was crisp, sweet and fresh",
    "never connects on the first try",
    "holds a charge for days",
]
_DETAILS = [
    "I use it every day on my commute",
    "my partner likes it even more than I do",
    "the instructions were confusing and half of them were missing",
    "support replied quickly and sent a replacement",
    "after two months it still looks new",
    "the packaging was wasteful",
    "it was on sale so I bought two",
    "I would not recommend it to a friend",
    "it pairs with my phone without any fuss",
    "the colour is not what the photo showed",
]


def generated_corpus(n: int, seed: int = 0) -> list[str]:
    """Review-like texts of about 48 word pieces each, deterministic for a seed."""
    rng = random.Random(seed)
    return [
        f"{rng.choice(_SUBJECTS)} {rng.choice(_VERDICTS)}; {rng.choice(_DETAILS)}, and "
        f"{rng.choice(_DETAILS)}. Overall {rng.randint(1, 5)} stars, order {rng.randint(1, 99999)}."
        for _ in range(n)
    ]


def file_corpus(path: Path, n: int) -> list[str]:
    """The `text` column of a CSV (gzip allowed), e.g. shared/data/imdb-reviews/reviews.csv.gz."""
    opener = gzip.open if path.suffix == ".gz" else open
    texts = []
    with opener(path, "rt", encoding="utf-8", newline="") as f:  # type: ignore[operator]
        for row in csv.DictReader(f):
            texts.append(re.sub(r"<br\s*/?>", " ", row["text"]))
            if len(texts) == n:
                break
    return texts


class Database:
    """A fresh database with the pgembed schema; dropped when the benchmark run ends."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self._dropped = ExitStack()
        # The tests' own throwaway databases: CREATE now, DROP ... WITH (FORCE) in drop().
        self.url = self._dropped.enter_context(database(server_url, "pgembed_bench"))
        self.name = database_name(self.url)
        with db.connection(self.url) as conn:
            migrate.migrate(conn)

    def connect(self) -> psycopg.Connection:
        return db.connect(self.url)

    def drop(self) -> None:
        self._dropped.close()


@contextmanager
def server(url: str | None) -> Iterator[str]:
    """The given server, or an embedded one in a temporary PGEMBED_HOME for this run."""
    if url:
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="pgembed-bench-") as home:
        yield embedded_server(Path(home))


def embedded_server(home: Path) -> str:
    """Start the embedded server in `home` (made reachable for its OS user); its URL."""
    home.chmod(0o755)  # the embedded server runs as its own OS user: it must reach its data
    os.environ["PGEMBED_HOME"] = str(home)
    for var in ("PGEMBED_DATABASE_URL", "DATABASE_URL"):
        os.environ.pop(var, None)
    from pgembed.embedded import server

    return server.url()


def create_reviews(conn: psycopg.Connection, texts: list[str], table: str = "reviews") -> None:
    conn.execute(f"DROP TABLE IF EXISTS {table}")  # type: ignore[arg-type]
    conn.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY, body text NOT NULL)")  # type: ignore[arg-type]
    with conn.cursor() as cur, cur.copy(f"COPY {table} (id, body) FROM STDIN") as copy:  # type: ignore[arg-type]
        for i, text in enumerate(texts):
            copy.write_row((i, text))


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]
