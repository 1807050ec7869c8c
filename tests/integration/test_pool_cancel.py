"""A search cancelled while it gives back its pooled connection (a `pgembed serve` client that
went away) never costs the pool that connection. psycopg_pool 3.3 takes a connection back under
its lock, held while it hands a connection to a waiting client: a borrower cancelled while
waiting for that lock lost its connection for good, and a few of those left searches waiting
out the pool's timeout (a 503 seen now and then in test_bad_requests_in_a_batch_fail_alone).
The lock is psycopg_pool's own (`_lock`): holding it is how this test makes the moment come."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any, LiteralString

from pgembed import db
from pgembed.search import plan


def statement(text: LiteralString) -> Generator[plan.Fetch, list[Any], list[Any]]:
    rows = yield plan.Fetch(text)
    return rows


def test_a_borrower_cancelled_while_it_gives_back_keeps_the_connection(db_url: str) -> None:
    async def scene() -> tuple[dict[str, int], list[Any]]:
        pool = db.async_pool(db_url, 1)
        pool.timeout = 2.0
        await pool.open(wait=True)
        try:
            slow = "SELECT 1 FROM pg_catalog.pg_sleep(0.3)"
            search = asyncio.ensure_future(plan.execute_async(pool, statement(slow)))
            await asyncio.sleep(0.1)  # its statement runs
            async with pool._lock:  # as another give-back holds it
                await asyncio.sleep(0.6)  # the statement is done: the give-back waits here
                search.cancel()
                await asyncio.gather(search, return_exceptions=True)
            await asyncio.sleep(0.1)
            stats = pool.get_stats()
            after = await plan.execute_async(pool, statement("SELECT 2"))
            return stats, after
        finally:
            await pool.close()

    stats, after = asyncio.run(scene())
    assert stats.get("pool_available") == stats.get("pool_size") == 1, stats
    assert after == [(2,)]
