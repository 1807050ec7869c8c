"""`pgembed.Client`: search and embed from Python, with exactly the models' settings.

The Client calls the same SQL helpers as plain SQL and the CLI (see `search`). Models are loaded
once per process and shared by every Client and thread; repeated query texts hit an LRU cache.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType

import psycopg

from pgembed import db, migrate
from pgembed.catalog import registry
from pgembed.encode import embedder
from pgembed.encode.embedder import Vectors
from pgembed.errors import UsageError
from pgembed.lifecycle import models
from pgembed.search import helpers
from pgembed.search.helpers import Filter, Hit, HybridHit


class Client:
    """A handle on one database. Thread-safe: each call borrows a connection of its own.

    `database_url=None` resolves like the CLI: $PGEMBED_DATABASE_URL, $DATABASE_URL, else the
    embedded server.
    """

    def __init__(self, database_url: str | None = None) -> None:
        self.url = db.resolve_url(database_url)
        self._pool = db.Pool(self.url)
        self._schema_checked = threading.Event()
        # A Client dropped without close() still closes its connections.
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
        with self._connection() as conn:
            spec = registry.get(conn, model)
            return helpers.query(conn, spec, text, k, filter, ef_search=ef_search)

    def similar(
        self,
        model: str,
        key: str | int,
        k: int = 10,
        filter: Filter | None = None,
        *,
        ef_search: int | None = None,
    ) -> list[Hit]:
        """The k rows nearest to the row with this key, itself excluded (pgembed.similar)."""
        with self._connection() as conn:
            spec = registry.get(conn, model)
            return helpers.similar(conn, spec, key, k, filter, ef_search=ef_search)

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
        with self._connection() as conn:
            spec = registry.get(conn, model)
            return helpers.hybrid(conn, spec, text, k, filter, ef_search=ef_search)

    def embed(self, model: str, texts: Sequence[str], *, queries: bool = False) -> Vectors:
        """Vectors (one row per text) exactly as the model embeds rows, or queries if `queries`."""
        if isinstance(texts, str):
            raise UsageError("embed() takes a list of texts, not one string")
        with self._connection() as conn:
            spec = registry.get(conn, model)
        encoder = embedder.get(models.settings_of(spec))
        texts = list(texts)
        return encoder.encode_queries(texts) if queries else encoder.encode_documents(texts)

    def close(self) -> None:
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

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        with helpers.errors(), self._pool.connection() as conn:
            if not self._schema_checked.is_set():
                migrate.require_current(conn)
                self._schema_checked.set()
            yield conn
