"""pgembed.AsyncClient: the Client's answers and errors on psycopg.AsyncConnection, concurrent
calls on a small pool, and an event loop that model loading and encoding never block.

pytest has no asyncio plugin here: each test runs its coroutine with asyncio.run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np
import pytest

import pgembed
from helpers import REVIEWS
from pgembed import db
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of

QUERY = "phone battery does not last the day"
GOLDFISH = "stamina of a goldfish"


def test_answers_equal_the_sync_clients(shop_url: str) -> None:
    good = {"rating": {"$gte": 4}}
    with pgembed.Client(shop_url) as client:
        expected: list[Any] = [
            client.search("minilm", QUERY, k=5, filter=good),
            client.search("minilm", QUERY, k=3, ef_search=200),
            client.similar("minilm", 1, k=4),
            client.hybrid_search("minilm", GOLDFISH, k=3),
        ]
        documents = client.embed("minilm", [QUERY, "fresh fruit"])
        queries = client.embed("minilm", [QUERY], queries=True)

    async def main() -> list[Any]:
        async with pgembed.AsyncClient(shop_url) as client:
            return [
                await client.search("minilm", QUERY, k=5, filter=good),
                await client.search("minilm", QUERY, k=3, ef_search=200),
                await client.similar("minilm", 1, k=4),
                await client.hybrid_search("minilm", GOLDFISH, k=3),
                await client.embed("minilm", [QUERY, "fresh fruit"]),
                await client.embed("minilm", [QUERY], queries=True),
            ]

    *hits, async_documents, async_queries = asyncio.run(main())
    assert hits == expected
    assert isinstance(hits[0][0], pgembed.Hit) and isinstance(hits[0][0].key, int)
    assert isinstance(hits[3][0], pgembed.HybridHit) and hits[3][0].key == 4
    np.testing.assert_allclose(async_documents, documents, atol=1e-6)
    np.testing.assert_allclose(async_queries, queries, atol=1e-6)


def test_concurrent_calls_share_a_small_pool(shop_url: str) -> None:
    texts = [f"{QUERY} #{i % 6}" for i in range(48)]
    with pgembed.Client(shop_url) as client:
        expected = [client.search("minilm", t, k=3) for t in texts]
        similar = [client.similar("minilm", key, k=2) for key in range(1, 13)]

    async def main() -> tuple[list[Any], list[Any], list[Any]]:
        async with pgembed.AsyncClient(shop_url, max_connections=2) as client:
            return await asyncio.gather(
                asyncio.gather(*(client.search("minilm", t, k=3) for t in texts)),
                asyncio.gather(*(client.similar("minilm", key, k=2) for key in range(1, 13))),
                asyncio.gather(*(client.hybrid_search("minilm", GOLDFISH, k=1) for _ in range(8))),
            )

    got, got_similar, hybrid = asyncio.run(main())
    assert got == expected and got_similar == similar
    assert all(h == hybrid[0] and h[0].key == 4 for h in hybrid)


def test_errors_are_the_same_pgembed_errors(shop_url: str, empty_db_url: str) -> None:
    async def main() -> None:
        async with pgembed.AsyncClient(shop_url) as client:
            with pytest.raises(pgembed.NotFoundError, match="unknown model 'nope'"):
                await client.search("nope", QUERY)
            with pytest.raises(pgembed.UsageError, match='has no column "ratings"'):
                await client.search("minilm", QUERY, filter={"ratings": 5})
            with pytest.raises(pgembed.UsageError, match="k must be an integer from 1"):
                await client.search("minilm", QUERY, k=0)
            with pytest.raises(pgembed.UsageError, match="the query text is empty"):
                await client.hybrid_search("minilm", "  ")
            with pytest.raises(pgembed.NotFoundError, match="no row with id"):
                await client.similar("minilm", 123456)
            with pytest.raises(pgembed.UsageError, match="list of texts"):
                await client.embed("minilm", "one string")
            assert len(await client.search("minilm", QUERY, k=1)) == 1  # still usable
        with pytest.raises(pgembed.UsageError, match="closed"):
            await client.search("minilm", QUERY)
        async with pgembed.AsyncClient(empty_db_url) as fresh:
            with pytest.raises(pgembed.SchemaError, match="run `pgembed migrate`"):
                await fresh.search("minilm", QUERY)
        async with pgembed.AsyncClient("postgresql://pgembed@127.0.0.1:1/none") as nowhere:
            with pytest.raises(pgembed.DatabaseError, match="cannot connect"):
                await nowhere.search("minilm", QUERY)

    asyncio.run(main())


def test_admin_methods_and_an_event_loop_never_blocked(
    empty_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with db.connection(empty_db_url) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text)")
        conn.cursor().executemany("INSERT INTO notes VALUES (%s, %s)", REVIEWS)
    caplog.set_level(logging.WARNING, logger="asyncio")
    slow = 0.3  # asyncio's debug mode logs every step that holds the loop longer than this

    async def main() -> None:
        asyncio.get_running_loop().slow_callback_duration = slow
        async with pgembed.AsyncClient(empty_db_url) as client:
            assert len(await client.migrate_schema()) > 0
            spec = await client.add_model(
                "notes", "notes", "body", query_prefix="async: ", precision="fp32"
            )
            settings = settings_of(spec)
            embedder._cache.pop(settings, None)  # so that the first search loads the model
            assert await client.sync_once() == pgembed.SyncResult(len(REVIEWS), 0, 0)
            [report] = await client.status()
            assert (report["rows_embedded"], report["queued"]) == (len(REVIEWS), 0)
            embedder._cache.pop(settings, None)
            hits = await client.search("notes", "apple pie", k=2)
            assert settings in embedder._cache and hits[0].key == 7
            vectors = await client.embed("notes", [text for _, text in REVIEWS] * 50)
            assert vectors.shape == (50 * len(REVIEWS), 384)

    asyncio.run(main(), debug=True)
    blocked = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert blocked == []

    async def control() -> None:  # the check above would have seen a blocked loop
        asyncio.get_running_loop().slow_callback_duration = slow
        time.sleep(slow + 0.1)

    asyncio.run(control(), debug=True)
    assert any("took" in r.getMessage() for r in caplog.records)


def test_connections_dead_since_their_last_use_cost_no_error(shop_url: str) -> None:
    async def main() -> None:
        async with pgembed.AsyncClient(shop_url, max_connections=3) as client:
            expected = await client.search("minilm", QUERY, k=3)
            await asyncio.gather(*(client.search("minilm", QUERY, k=3) for _ in range(12)))
            with db.connection(shop_url) as conn:  # as a server restart would
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            assert await client.search("minilm", QUERY, k=3) == expected

    asyncio.run(main())


def test_concurrent_searches_are_encoded_in_batches(shop_url: str) -> None:
    """The tasks' query texts that wait for the encoder at once are encoded together
    (search/batching.py, as `pgembed serve` does), each search with its own hits."""
    texts = [f"async batching: is the {thing} any good" for thing in range(12)]

    async def main() -> tuple[list[Any], Any]:
        async with pgembed.AsyncClient(shop_url, max_wait=0.05) as client:
            found = await asyncio.gather(*(client.search("minilm", t, k=3) for t in texts))
            return list(found), client.batcher.stats

    found, stats = asyncio.run(main())
    assert stats.queries == len(texts) and stats.batches < len(texts), stats
    with pgembed.Client(shop_url) as client:  # (the texts' vectors are in the query cache now)
        expected = {text: client.search("minilm", text, k=3) for text in texts}
    for text, hits in zip(texts, found, strict=True):
        want = expected[text]
        assert [hit.similarity for hit in hits] == pytest.approx(
            [hit.similarity for hit in want], abs=1e-6
        )
