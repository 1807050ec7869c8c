"""`pgembed.Client`: search and embed from Python, with exactly the models' settings.

The Client runs the same search plans as the CLI (see `search/planner.py`) on a pool of
connections (psycopg_pool) that many threads share. Models are loaded once per process and shared
by every Client and thread; repeated query texts hit an LRU cache. `AsyncClient`
(`pgembed/aclient.py`) is the same for asyncio: the methods of both are declared once, in
clientcore.py; this module is the Client's driver (its pool and lifecycle).
"""

from __future__ import annotations

import threading
import weakref
from types import TracebackType
from typing import TypeVar

from psycopg_pool import ConnectionPool

from pgembed import db, defaults, locate
from pgembed.clientcore import Blocking, Methods, OnPool, WithUrl, Work, check_database
from pgembed.errors import UsageError
from pgembed.search import plan

_T = TypeVar("_T")


class Client(Methods, Blocking):
    """A handle on one database. Thread-safe: share one Client between all threads.

    `database_url=None` resolves like the CLI: $PGEMBED_DATABASE_URL, $DATABASE_URL, else the
    embedded server. Nothing connects until the first call; that call says at once if the
    database cannot be reached or needs `pgembed migrate`. At most `max_connections` connections
    are open; `close()` (or leaving a `with` block, or dropping the Client) closes them.
    """

    def __init__(
        self, database_url: str | None = None, *, max_connections: int = defaults.POOL_MAX_SIZE
    ) -> None:
        self.url = locate.resolve_url(database_url)
        self._pool = db.pool(self.url, max_connections)
        self._lock = threading.Lock()
        self._opened = False
        self._closed = False
        # A Client dropped without close() still closes its pool (and stops its threads).
        self._close = weakref.finalize(self, self._pool.close)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _do(self, work: Work[_T]) -> _T:
        if isinstance(work, WithUrl):  # pgembed.api's: it connects itself
            return work.function(self.url)
        pool = self._ready()
        if isinstance(work, OnPool):
            return plan.execute(pool, work.plan)
        with plan.errors(), pool.connection() as conn:
            return work.function(conn)

    def _ready(self) -> ConnectionPool:
        """The pool, opened on first use once a plain connection has shown that the database
        answers and its schema is current (the pool itself would only retry in the background)."""
        if self._opened and not self._closed:
            return self._pool
        with self._lock:
            if self._closed:
                raise UsageError("this Client is closed")
            if not self._opened:
                check_database(self.url)
                self._pool.open()
                self._opened = True
        return self._pool
