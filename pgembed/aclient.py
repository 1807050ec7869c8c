"""`pgembed.AsyncClient`: the Client's methods for asyncio applications.

Searches run the same plans as `pgembed.Client` (search/planner.py) on `psycopg.AsyncConnection`s
from an `AsyncConnectionPool`. Everything that would block the event loop runs in a thread
(`asyncio.to_thread`): loading a model and encoding, the first connection check, and the
administrative calls (migrate_schema, add_model, alter_model, sync_once, status), which reuse the
synchronous implementations of pgembed.api.

Query texts are encoded with dynamic batching (search/batching.py): the searches of many tasks
that wait for the encoder at once are encoded together, as `pgembed serve` does.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack, cast

from psycopg_pool import AsyncConnectionPool

from pgembed import api, db, defaults, locate
from pgembed.api import AlterOptions, ModelOptions, SyncResult
from pgembed.catalog.registry import ModelSpec
from pgembed.client import check_database, encode, require_texts
from pgembed.encode.embedder import Vectors
from pgembed.errors import UsageError
from pgembed.lifecycle.altertable import Altered
from pgembed.search import batching, plan, planner
from pgembed.search.planner import Filter, Hit, HybridHit, SearchRequest

_T = TypeVar("_T")


class AsyncClient:
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

    async def search(
        self,
        model: str,
        text: str,
        k: int = 10,
        filter: Filter | None = None,
        *,
        ef_search: int | None = None,
    ) -> list[Hit]:
        """The k rows nearest to `text`, nearest first (pgembed.search)."""
        request = SearchRequest(model, text=text, k=k, filter=filter, ef_search=ef_search)
        return cast(list[Hit], await self._run(planner.plan(request)))

    async def similar(
        self,
        model: str,
        key: object,
        k: int = 10,
        filter: Filter | None = None,
        *,
        ef_search: int | None = None,
    ) -> list[Hit]:
        """The k rows nearest to the row with this key, itself excluded (pgembed.similar)."""
        request = SearchRequest(model, similar_to=key, k=k, filter=filter, ef_search=ef_search)
        return cast(list[Hit], await self._run(planner.plan(request)))

    async def hybrid_search(
        self,
        model: str,
        text: str,
        k: int = 10,
        filter: Filter | None = None,
        *,
        ef_search: int | None = None,
    ) -> list[HybridHit]:
        """Vector and full-text rankings of `text`, fused by rank (pgembed.hybrid_search)."""
        request = SearchRequest(
            model, text=text, hybrid=True, k=k, filter=filter, ef_search=ef_search
        )
        return cast(list[HybridHit], await self._run(planner.plan(request)))

    async def embed(self, model: str, texts: Iterable[str], *, queries: bool = False) -> Vectors:
        """Vectors (one row per text) exactly as the model embeds rows, or queries if `queries`;
        encoded in a thread."""
        checked = require_texts(texts)
        spec = await self._run(planner.spec_plan(model))
        return await asyncio.to_thread(encode, spec, checked, queries)

    async def migrate_schema(self) -> list[str]:
        """`pgembed.migrate_schema` on this client's database, in a thread."""
        return await asyncio.to_thread(api.migrate_schema, await self._resolved_url())

    async def add_model(
        self, name: str, table: str, column: str, **options: Unpack[ModelOptions]
    ) -> ModelSpec:
        """`pgembed.add_model` on this client's database, in a thread (it loads the model)."""
        url = await self._resolved_url()
        add = functools.partial(api.add_model, name, table, column, database_url=url, **options)
        return await asyncio.to_thread(add)

    async def alter_model(self, name: str, **options: Unpack[AlterOptions]) -> ModelSpec:
        """`pgembed.alter_model` on this client's database, in a thread (it loads the model and
        reindexes)."""
        url = await self._resolved_url()
        alter = functools.partial(api.alter_model, name, database_url=url, **options)
        return await asyncio.to_thread(alter)

    async def alter_table(self, table: str, statement: str) -> Altered:
        """`pgembed.alter_table` on this client's database, in a thread."""
        url = await self._resolved_url()
        alter = functools.partial(api.alter_table, table, statement, database_url=url)
        return await asyncio.to_thread(alter)

    async def sync_once(self, models: str | Sequence[str] | None = None) -> SyncResult:
        """`pgembed.sync_once` on this client's database, in a thread (it encodes)."""
        return await asyncio.to_thread(api.sync_once, models, await self._resolved_url())

    async def status(self, *, exact: bool = False) -> list[dict[str, Any]]:
        """`pgembed.status` on this client's database, in a thread."""
        return await asyncio.to_thread(api.status, await self._resolved_url(), exact=exact)

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

    async def _run(self, work: plan.Plan[_T]) -> _T:
        return await plan.execute_async(await self._ready(), work, self.batcher.embed)

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
