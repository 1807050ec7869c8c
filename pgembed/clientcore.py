"""What `pgembed.Client` and `pgembed.AsyncClient` do, declared once for both.

Each public method of the two clients is declared here, in `Methods`: its signature, docstring
and argument checks, and the `Work` it asks for (a plan on the client's pool, a function of a
connection, or a pgembed.api call with the database URL). `@Method` makes of a declaration a
method of either client, typed for each: `Client` (client.py) does the Work and returns its
result; `AsyncClient` (aclient.py) returns a coroutine of it, and does in a thread whatever
would block the event loop. The two drivers hold only what truly differs: the pool, the
lifecycle, threads, the AsyncClient's query batching.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from types import MethodType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, Unpack, cast, overload

import psycopg

from pgembed import api, db, migrate
from pgembed.api import AlterOptions, ModelOptions, SyncResult
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.embedder import Vectors
from pgembed.encode.settings import settings_of
from pgembed.errors import UsageError
from pgembed.lifecycle import status as lifecycle_status
from pgembed.lifecycle.altertable import Altered
from pgembed.search import plan, planner
from pgembed.search.plan import Compute, Plan
from pgembed.search.planner import Filter, Hit, HybridHit, SearchRequest

_P = ParamSpec("_P")
_T = TypeVar("_T")


# --- the work a method asks for ----------------------------------------------------------------


@dataclass(frozen=True)
class OnPool(Generic[_T]):
    """Run `plan` on the client's pool (opened on first use)."""

    plan: Plan[_T]


@dataclass(frozen=True)
class OnConnection(Generic[_T]):
    """Call `function` with a synchronous connection: one of the Client's pool; for the
    AsyncClient a connection of its own, in a thread."""

    function: Callable[[psycopg.Connection], _T]


@dataclass(frozen=True)
class WithUrl(Generic[_T]):
    """Call `function` (of pgembed.api, which connects itself) with the database URL; the
    AsyncClient, in a thread."""

    function: Callable[[str], _T]


Work = OnPool[_T] | OnConnection[_T] | WithUrl[_T]


class Blocking:
    """A client whose methods return their results (Client)."""

    def _do(self, work: Work[_T]) -> _T:
        raise NotImplementedError


class Awaiting:
    """A client whose methods return coroutines (AsyncClient)."""

    async def _do(self, work: Work[_T]) -> _T:
        raise NotImplementedError


# --- one declaration, two methods --------------------------------------------------------------


class Method(Generic[_P, _T]):
    """A client method declared once: `declare(self, ...)` checks the arguments and says what
    Work to do. On a Client (a `Blocking`) it is a method that does the Work; on an AsyncClient
    (an `Awaiting`), a coroutine method. Both have the declaration's name, docstring and
    signature, its return annotation being what the Work gives."""

    def __init__(self, declare: Callable[Concatenate[Any, _P], Work[_T]]) -> None:
        def blocking(client: Blocking, *args: Any, **kwargs: Any) -> Any:
            return client._do(declare(client, *args, **kwargs))

        async def awaiting(client: Awaiting, *args: Any, **kwargs: Any) -> Any:
            return await client._do(declare(client, *args, **kwargs))

        self._blocking = _like(blocking, declare)
        self._awaiting = _like(awaiting, declare)

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Callable[..., Any]: ...

    @overload
    def __get__(
        self, client: Awaiting, owner: type[Any] | None = None
    ) -> Callable[_P, Coroutine[Any, Any, _T]]: ...

    @overload
    def __get__(self, client: Blocking, owner: type[Any] | None = None) -> Callable[_P, _T]: ...

    def __get__(self, client: object, owner: type[Any] | None = None) -> Callable[..., Any]:
        kind = type(client) if owner is None else owner
        function = self._awaiting if issubclass(kind, Awaiting) else self._blocking
        return function if client is None else MethodType(function, client)


def _like(function: Callable[..., Any], declare: Callable[..., Any]) -> Callable[..., Any]:
    """`function` named, documented and signed as `declare` (for help(), IDEs and inspect), but
    for its return annotation: `Work[X]` becomes X."""
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(function, name, getattr(declare, name))
    signature = inspect.signature(declare)
    given = str(signature.return_annotation).removeprefix("Work[").removesuffix("]")
    function.__signature__ = signature.replace(return_annotation=given)  # type: ignore[attr-defined]
    function.__annotations__ = {**declare.__annotations__, "return": given}
    return function


class Methods:
    """The methods that Client and AsyncClient share."""

    @Method
    def search(
        self,
        model: str,
        text: str,
        k: int = 10,
        filter: Filter | None = None,
        *,
        ef_search: int | None = None,
    ) -> Work[list[Hit]]:
        """The k rows nearest to `text`, nearest first (pgembed.search)."""
        request = SearchRequest(model, text=text, k=k, filter=filter, ef_search=ef_search)
        return OnPool(cast(Plan[list[Hit]], planner.plan(request)))

    @Method
    def similar(
        self,
        model: str,
        key: object,
        k: int = 10,
        filter: Filter | None = None,
        *,
        ef_search: int | None = None,
    ) -> Work[list[Hit]]:
        """The k rows nearest to the row with this key, itself excluded (pgembed.similar)."""
        request = SearchRequest(model, similar_to=key, k=k, filter=filter, ef_search=ef_search)
        return OnPool(cast(Plan[list[Hit]], planner.plan(request)))

    @Method
    def hybrid_search(
        self,
        model: str,
        text: str,
        k: int = 10,
        filter: Filter | None = None,
        *,
        ef_search: int | None = None,
    ) -> Work[list[HybridHit]]:
        """Vector and full-text rankings of `text`, fused by rank (pgembed.hybrid_search)."""
        request = SearchRequest(
            model, text=text, hybrid=True, k=k, filter=filter, ef_search=ef_search
        )
        return OnPool(cast(Plan[list[HybridHit]], planner.plan(request)))

    @Method
    def embed(self, model: str, texts: Iterable[str], *, queries: bool = False) -> Work[Vectors]:
        """Vectors (one row per text) exactly as the model embeds rows, or queries if `queries`
        (the AsyncClient encodes in a thread)."""
        return OnPool(_encoded(model, require_texts(texts), queries))

    @Method
    def migrate_schema(self) -> Work[list[str]]:
        """`pgembed.migrate_schema` on this client's database (the AsyncClient's in a thread)."""
        return WithUrl(api.migrate_schema)

    @Method
    def add_model(
        self, name: str, table: str, column: str, **options: Unpack[ModelOptions]
    ) -> Work[ModelSpec]:
        """`pgembed.add_model` on this client's database (the AsyncClient's in a thread: it loads
        the model)."""
        return WithUrl(lambda url: api.add_model(name, table, column, database_url=url, **options))

    @Method
    def alter_model(self, name: str, **options: Unpack[AlterOptions]) -> Work[ModelSpec]:
        """`pgembed.alter_model` on this client's database (the AsyncClient's in a thread: it
        loads the model and reindexes)."""
        return WithUrl(lambda url: api.alter_model(name, database_url=url, **options))

    @Method
    def alter_table(self, table: str, statement: str) -> Work[Altered]:
        """`pgembed.alter_table` on this client's database (the AsyncClient's in a thread)."""
        return WithUrl(lambda url: api.alter_table(table, statement, database_url=url))

    @Method
    def sync_once(self, models: str | Sequence[str] | None = None) -> Work[SyncResult]:
        """`pgembed.sync_once` on this client's database (the AsyncClient's in a thread: it
        encodes)."""
        return WithUrl(lambda url: api.sync_once(models, url))

    @Method
    def status(self, *, exact: bool = False) -> Work[list[dict[str, Any]]]:
        """`pgembed.status` on this client's database (the Client's through its pool, the
        AsyncClient's in a thread)."""
        return OnConnection(lambda conn: lifecycle_status.all_status(conn, exact))


# --- what both drivers use ---------------------------------------------------------------------


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


def _encoded(model: str, texts: list[str], queries: bool) -> Plan[Vectors]:
    """The model's catalog row, then its texts encoded (CPU-bound: a Compute step)."""
    spec = yield from planner.spec_plan(model)
    vectors: Vectors = yield Compute(functools.partial(encode, spec, texts, queries))
    return vectors


def encode(spec: ModelSpec, texts: list[str], queries: bool) -> Vectors:
    """Texts embedded with every setting of the model: as its rows, or as queries."""
    encoder = embedder.get(settings_of(spec))
    return encoder.encode_queries(texts) if queries else encoder.encode_documents(texts)
