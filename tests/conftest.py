"""Real PostgreSQL (embedded, or $PGEMBED_TEST_DATABASE_URL) and the real model.

One template database with the pgembed schema is built per session; each test gets its own
database cloned from it (CREATE DATABASE ... TEMPLATE), which keeps tests fast and isolated.
Every database here, template or clone, comes from helpers.database and is dropped after use.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator

import psycopg
import pytest

# Several pytest-xdist workers on the machine's cores: one torch thread each (and in the daemons
# they start), as OMP_NUM_THREADS tells pgembed's encoder: threads that outnumber the cores cost
# CPU (docs/development.md). Set before any import of torch, which reads it at its start.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from daemon_helpers import embedded_server_url, stop_server
from helpers import REVIEWS, database, database_name, make_items
from pgembed import db, migrate
from pgembed.catalog import registry
from pgembed.lifecycle import models


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, the acceptance tier first: its tests are the longest, and work
    stealing (the Makefile's --dist worksteal) hands over the tail of a worker's queue, where a
    long test would leave the other workers idle at the end. Alone, pytest keeps the order of
    testpaths, fast failures first."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: not item.nodeid.startswith("tests/acceptance/"))  # stable


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    explicit = os.environ.get("PGEMBED_TEST_DATABASE_URL")
    if explicit:
        yield explicit
        return
    # Not under pytest's base temp directory: a second pytest session on the machine deletes all
    # but the newest three of those, the running server's data directory with them. Removed at
    # exit, after the wheel's own exit handler (registered later, so run earlier) stops it.
    home = tempfile.mkdtemp(prefix="pgembed-test-home-")
    atexit.register(shutil.rmtree, home, True)
    os.environ["PGEMBED_HOME"] = home
    for var in ("PGEMBED_DATABASE_URL", "DATABASE_URL"):
        os.environ.pop(var, None)
    yield embedded_server_url()
    stop_server()  # after a restart the wheel's handle cannot stop the server itself


@pytest.fixture(scope="session")
def template_url(server_url: str) -> Iterator[str]:
    """Once per session: the database with the pgembed schema that db_url copies."""
    with database(server_url, "pgembed_test_template") as url:
        with db.connection(url) as conn:
            migrate.migrate(conn)
        yield url


@pytest.fixture
def db_url(server_url: str, template_url: str) -> Iterator[str]:
    """A fresh database with the pgembed schema installed."""
    with database(server_url, "t", template=database_name(template_url)) as url:
        yield url


@pytest.fixture
def empty_db_url(server_url: str) -> Iterator[str]:
    """A fresh database without the pgembed schema."""
    with database(server_url, "e") as url:
        yield url


@pytest.fixture
def other_empty_db_url(server_url: str) -> Iterator[str]:
    """A second fresh database without the pgembed schema (empty_db_url gives the first)."""
    with database(server_url, "e") as url:
        yield url


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    with db.connection(db_url) as connection:
        yield connection


@pytest.fixture
def reviews(conn: psycopg.Connection) -> psycopg.Connection:
    """A small `reviews` table (id primary key, body text, stars int)."""
    conn.execute("CREATE TABLE reviews (id integer PRIMARY KEY, body text, stars integer)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO reviews (id, body, stars) VALUES (%s, %s, 3)", REVIEWS)
    return conn


@pytest.fixture
def spec(reviews: psycopg.Connection) -> registry.ModelSpec:
    """Model `minilm` watching `reviews.body`, in fp32 (the precision of the reference vectors)."""
    request = models.AddRequest("minilm", "reviews", "body", precision="fp32")
    return models.add(reviews, request)[0]


@pytest.fixture(scope="session")
def shop_template(server_url: str, template_url: str) -> Iterator[str]:
    """Once per session: the 324 sample reviews (id, product, category, rating, text), embedded
    by model `minilm` (all-MiniLM-L6-v2, mean pooling, fp32) with its full-text index. fp32: the
    precision check of `auto` (two encodes of a sample, a second model loaded) is not what the
    tests on these reviews are about."""
    from pgembed import samples
    from pgembed.sync import worker

    with database(server_url, "pgembed_test_shop", template=database_name(template_url)) as url:
        with db.connection(url) as conn:
            samples.load(conn, "public", "reviews")
            models.add(
                conn,
                models.AddRequest("minilm", "reviews", "text", fulltext=True, precision="fp32"),
            )
        worker.Worker(url, worker.Options(once=True)).run()
        with db.connection(url) as conn:
            conn.execute("ANALYZE reviews")  # stable plans in every copy
        yield database_name(url)


@pytest.fixture
def shop_url(server_url: str, shop_template: str) -> Iterator[str]:
    """A fresh copy of the embedded sample reviews, to read or change at will."""
    with database(server_url, "s", template=shop_template) as url:
        yield url


@pytest.fixture(scope="session")
def items_template(server_url: str, template_url: str) -> Iterator[str]:
    """Once per session: 3,000 `items` with random vectors (see helpers.make_items)."""
    with database(server_url, "pgembed_test_items", template=database_name(template_url)) as url:
        with db.connection(url) as conn:
            make_items(conn)
        yield database_name(url)


@pytest.fixture
def items_url(server_url: str, items_template: str) -> Iterator[str]:
    """A fresh copy of the 3,000 items: big enough for the planner to choose the HNSW index."""
    with database(server_url, "i", template=items_template) as url:
        yield url
