"""The SQL helpers' limits: one clear error, or a result, never an internal failure."""

from __future__ import annotations

import psycopg
import pytest

from pgembed import db


def test_hybrid_search_takes_any_k(shop_url: str) -> None:
    with db.connection(shop_url) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM pgembed.hybrid_search('minilm', "
            "(SELECT embedding_minilm FROM reviews LIMIT 1), 'battery', 2147483647)"
        ).fetchone()
        total = conn.execute("SELECT count(*) FROM reviews").fetchone()
    assert rows is not None and total is not None and 0 < rows[0] <= total[0]


def test_hybrid_search_query_text_is_bounded(shop_url: str) -> None:
    with db.connection(shop_url) as conn:
        query = (
            "SELECT count(*) FROM pgembed.hybrid_search('minilm', "
            "(SELECT embedding_minilm FROM reviews LIMIT 1), %s, 5)"
        )
        # The longest text accepted parses (no "stack depth limit exceeded") ...
        assert conn.execute(query, ("battery life " * 769,)).fetchone() == (5,)
        # ... and a longer one is one clear error.
        with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="at most 10000"):
            conn.execute(query, ("battery " * 20000,))
