"""The integration tier's shared table of real vectors: built once per session (per worker),
read by test_search_recall.py and test_filter_values.py (a test that changes it rolls back)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import recall_helpers
from pgvector import Vector

from helpers import database, database_name
from pgembed import db


@pytest.fixture(scope="session")
def real_url(server_url: str, template_url: str) -> Iterator[str]:
    """recall_helpers.make_reviews' 2,500 reviews' vectors, in a database of their own."""
    with database(server_url, "pgembed_test_real", template=database_name(template_url)) as url:
        with db.connection(url) as conn:
            recall_helpers.make_reviews(conn)
        yield url


@pytest.fixture
def real(real_url: str) -> Iterator[psycopg.Connection]:
    with db.connection(real_url) as conn:
        yield conn


@pytest.fixture(scope="session")
def queries() -> list[Vector]:
    return recall_helpers.queries()
