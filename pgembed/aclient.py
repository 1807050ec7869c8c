"""`pgembed.AsyncClient`: the Client's methods for asyncio applications.

The methods are the Client's, declared once in clientcore.py; this module is the asyncio driver.
Searches run the same plans as `pgembed.Client` (search/planner.py) on `psycopg.AsyncConnection`s
from an `AsyncConnectionPool`. Everything that would block the event loop runs in a thread
(`asyncio.to_thread`): loading a model and encoding, the first connection check, and the
administrative calls (migrate_schema, add_model, alter_model, alter_table, sync_once, status),
which reuse the synchronous implementations of pgembed.api.

Query texts are encoded with dynamic batching (search/batching.py): the searches of many tasks
that wait for the encoder at once are encoded together, as `pgembed serve` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgembed import api, db, defaults, locate
from pgembed.clientcore import Awaiting, Methods, OnPool, WithUrl, Work, check_database
from pgembed.errors import UsageError
from pgembed.search import batching, plan

_T = TypeVar("_T")


class AsyncClient(Methods, Awaiting):
    """A handle on one database for asyncio code; share one per application (and event loop).

        async with pgembed.AsyncClient(url) as client:
            hits = await client.search("minilm", "battery dies fast", k=5)

    `database_url=None` resolves like the CLI (in a thread, since that may start the embedded
    server). Nothing connects until the first call. Close it with `async with` or
    `await client.close()`: its pool's tasks belong to the event loop it was first used in.

    Concurrent searches' query texts are encoded in batches of at most `max_batch` (1: one at
    a time), an idle encoder waiting at most `max_wait` seconds for companions.
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        max_connections: int = defaults.POOL_MAX_SIZE,
        max_batch: int = batching.MAX_BATCH,
        max_wait: float = batching.MAX_WAIT,
    ) -> None:
        db.check_pool_size(max_connections)
        if max_batch < 1 or max_wait < 0:
            raise UsageError("max_batch must be at least 1 and max_wait not negative")
        self.batcher = batching.QueryBatcher(max_batch, max_wait)
        self._database_url = database_url
        self._url: str | None = None
        self._max_connections = max_connections
        self._pool: AsyncConnectionPool | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    async def close(self) -> None:
        async with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        await self.batcher.close()
        if pool is not None:
            await pool.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def _do(self, work: Work[_T]) -> _T:
        if isinstance(work, OnPool):
            return await plan.execute_async(await self._ready(), work.plan, self.batcher.embed)
        url = await self._resolved_url()
        if isinstance(work, WithUrl):
            return await asyncio.to_thread(work.function, url)
        return await asyncio.to_thread(_connected, work.function, url)

    async def _resolved_url(self) -> str:
        if self._url is None:
            self._url = await asyncio.to_thread(locate.resolve_url, self._database_url)
        return self._url

    async def _ready(self) -> AsyncConnectionPool:
        """The pool, opened on first use after a plain connection (in a thread) has shown that
        the database answers and its schema is current."""
        pool = self._pool
        if pool is not None:
            return pool
        async with self._lock:
            if self._closed:
                raise UsageError("this AsyncClient is closed")
            if self._pool is None:
                url = await self._resolved_url()
                await asyncio.to_thread(check_database, url)
                opening = db.async_pool(url, self._max_connections)
                await opening.open()
                self._pool = opening
            return self._pool


def _connected(function: Callable[[psycopg.Connection], _T], url: str) -> _T:
    """function(conn) on a connection of its own (as pgembed.api's functions run)."""
    with api.connection(url) as conn:
        return function(conn)
