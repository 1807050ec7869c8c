"""`pgembed.Client`: search and embed from Python, with exactly the models' settings.

The Client runs the same search plans as the CLI (see `search/planner.py`) on a pool of
connections (psycopg_pool) that many threads share. Models are loaded once per process and shared
by every Client and thread; repeated query texts hit an LRU cache. `AsyncClient`
(`pgembed/aclient.py`) is the same for asyncio.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack, cast

from psycopg_pool import ConnectionPool

from pgembed import api, db, defaults, locate, migrate
from pgembed.api import AlterOptions, ModelOptions, SyncResult
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.embedder import Vectors
from pgembed.encode.settings import settings_of
from pgembed.errors import UsageError
from pgembed.lifecycle import status as lifecycle_status
from pgembed.lifecycle.altertable import Altered
from pgembed.search import plan, planner
from pgembed.search.planner import Filter, Hit, HybridHit, SearchRequest

_T = TypeVar("_T")


class Client:
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

    def search(
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
        return cast(list[Hit], self._run(planner.plan(request)))

    def similar(
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
        return cast(list[Hit], self._run(planner.plan(request)))

    def hybrid_search(
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
        return cast(list[HybridHit], self._run(planner.plan(request)))

    def embed(self, model: str, texts: Iterable[str], *, queries: bool = False) -> Vectors:
        """Vectors (one row per text) exactly as the model embeds rows, or queries if `queries`."""
        checked = require_texts(texts)
        return encode(self._run(planner.spec_plan(model)), checked, queries)

    def migrate_schema(self) -> list[str]:
        """`pgembed.migrate_schema` on this Client's database."""
        return api.migrate_schema(self.url)

    def add_model(
        self, name: str, table: str, column: str, **options: Unpack[ModelOptions]
    ) -> ModelSpec:
        """`pgembed.add_model` on this Client's database."""
        return api.add_model(name, table, column, database_url=self.url, **options)

    def alter_model(self, name: str, **options: Unpack[AlterOptions]) -> ModelSpec:
        """`pgembed.alter_model` on this Client's database."""
        return api.alter_model(name, database_url=self.url, **options)

    def alter_table(self, table: str, statement: str) -> Altered:
        """`pgembed.alter_table` on this Client's database."""
        return api.alter_table(table, statement, database_url=self.url)

    def sync_once(self, models: str | Sequence[str] | None = None) -> SyncResult:
        """`pgembed.sync_once` on this Client's database."""
        return api.sync_once(models, self.url)

    def status(self, *, exact: bool = False) -> list[dict[str, Any]]:
        """`pgembed.status` on this Client's database (through its pool)."""
        with plan.errors(), self._ready().connection() as conn:
            return lifecycle_status.all_status(conn, exact)

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

    def _run(self, work: plan.Plan[_T]) -> _T:
        return plan.execute(self._ready(), work)

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


def check_database(url: str) -> None:
    """Connect once: a wrong URL, a server that is down, a schema to migrate: one clear error."""
    with plan.errors(), db.connection(url) as conn:
        migrate.require_current(conn)


def require_texts(texts: Iterable[str]) -> list[str]:
    """The texts as a list of strings the tokenizer takes (its own errors about anything else are
    obscure); any iterable, a generator too, is read once."""
    if isinstance(texts, str | bytes):
        raise UsageError(f"embed() takes a list of texts, not one {type(texts).__name__}")
    texts = list(texts)
    for number, text in enumerate(texts):
        if not isinstance(text, str):
            raise UsageError(f"embed() takes strings: text {number} is {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise UsageError(f"text {number} is not valid Unicode (a lone surrogate)") from None
    return texts


def encode(spec: ModelSpec, texts: list[str], queries: bool) -> Vectors:
    """Texts embedded with every setting of the model: as its rows, or as queries."""
    encoder = embedder.get(settings_of(spec))
    return encoder.encode_queries(texts) if queries else encoder.encode_documents(texts)
