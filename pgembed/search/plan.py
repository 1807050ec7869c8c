"""Plans: a search as a generator of steps (`Fetch` a statement's rows, `Embed` a query text)
that does no I/O itself, and the two drivers that run one: `execute` on a psycopg connection or
pool, `execute_async` on an async one (which embeds in a thread, off the event loop). Both walk
the plan with one loop (`_Walk`) and differ only in how they answer a step. The plans
themselves are in planner.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Generic, LiteralString, TypeVar

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgembed import db
from pgembed.catalog.registry import ModelSpec
from pgembed.encode.embedder import Vectors
from pgembed.errors import DatabaseError, NotFoundError, PgembedError, UsageError
from pgembed.search.vectors import embed_query

_T = TypeVar("_T")


@dataclass(frozen=True)
class Fetch:
    """Run one statement and send back its rows (dicts with `as_dicts`). With `transaction`, it
    runs in a transaction of its own, where `ef_search` (if given) is set for it alone."""

    statement: LiteralString | sql.SQL | sql.Composed
    params: Mapping[str, Any] | tuple[Any, ...] = ()
    transaction: bool = False
    ef_search: int | None = None
    as_dicts: bool = False


@dataclass(frozen=True)
class Embed:
    """Send back the query vector of `text` (CPU-bound: the async driver runs it in a thread)."""

    spec: ModelSpec
    text: str


@dataclass(frozen=True)
class Compute:
    """Send back `function()`: other CPU-bound work (encoding texts), which the async driver
    runs in a thread too."""

    function: Callable[[], Any]


Step = Fetch | Embed | Compute
Plan = Generator[Step, Any, _T]


class _Walk(Generic[_T]):
    """A plan walked by a driver, the one loop both share: iterating gives its steps; the driver
    answers each in `answering()`, setting `reply`, and a PgembedError raised there goes to the
    plan instead (which may handle it: see _in_one_space); `result` is the plan's value."""

    def __init__(self, plan: Plan[_T]) -> None:
        self._plan = plan
        self._failure: PgembedError | None = None
        self.reply: Any = None
        self.result: _T

    def __iter__(self) -> Iterator[Step]:
        return self

    def __next__(self) -> Step:
        reply, failure = self.reply, self._failure
        self.reply, self._failure = None, None
        try:
            return self._plan.send(reply) if failure is None else self._plan.throw(failure)
        except StopIteration as done:
            self.result = done.value
            raise

    @contextmanager
    def answering(self) -> Iterator[None]:
        try:
            yield
        except PgembedError as exc:
            self._failure = exc


def execute(conn: psycopg.Connection | ConnectionPool[psycopg.Connection], plan: Plan[_T]) -> _T:
    """Run a plan on a connection, or on a pool's (borrowed for each statement, so none is held
    while a model loads or encodes); its errors are pgembed errors."""
    walk = _Walk(plan)
    for step in walk:
        with walk.answering():
            if isinstance(step, Fetch):
                walk.reply = _fetch(conn, step)
            else:
                walk.reply = _compute(step)
    return walk.result


async def execute_async(
    conn: psycopg.AsyncConnection | AsyncConnectionPool[psycopg.AsyncConnection],
    plan: Plan[_T],
    embed: Callable[[ModelSpec, str], Awaitable[Vectors]] | None = None,
) -> _T:
    """The same on an async connection or pool; embedding runs in a thread, never on the event
    loop, or through `embed` (a QueryBatcher's, search/batching.py)."""
    walk = _Walk(plan)
    for step in walk:
        with walk.answering():
            if isinstance(step, Fetch):
                walk.reply = await _fetch_async(conn, step)
            elif isinstance(step, Embed) and embed is not None:
                walk.reply = await embed(step.spec, step.text)
            else:
                walk.reply = await asyncio.to_thread(_compute, step)
    return walk.result


def _compute(step: Embed | Compute) -> Any:
    return step.function() if isinstance(step, Compute) else embed_query(step.spec, step.text)


# The helpers' override of hnsw.ef_search, for the rest of the transaction: it wins over the
# model's default, even pgvector's 40. The one place pgembed sets it (plans, topk, the ORM); it
# answers the value it replaces ('' for none), to put back in a caller's transaction.
SET_EF_SEARCH: LiteralString = (
    "SELECT COALESCE(pg_catalog.current_setting('pgembed.ef_search', true), ''), "
    "pg_catalog.set_config('pgembed.ef_search', %s, true)"
)


def set_ef_search(conn: psycopg.Connection, ef_search: int | str) -> str:
    """Set pgembed.ef_search for the transaction; the value it had."""
    row = conn.execute(SET_EF_SEARCH, (str(ef_search),)).fetchone()
    return str(row[0]) if row else ""


async def set_ef_search_async(conn: psycopg.AsyncConnection, ef_search: int | str) -> str:
    """The same on an async connection."""
    cur = await conn.execute(SET_EF_SEARCH, (str(ef_search),))
    row = await cur.fetchone()
    return str(row[0]) if row else ""


def _fetch(conn: psycopg.Connection | ConnectionPool[psycopg.Connection], step: Fetch) -> list[Any]:
    if isinstance(conn, ConnectionPool):
        return _fetch_pooled(conn, step)
    with errors():
        if not step.transaction:
            return _rows(conn, step)
        # Inside a caller's transaction (the ORM's session), a savepoint: ef_search is put back.
        nested = conn.info.transaction_status != TransactionStatus.IDLE
        with conn.transaction():
            if step.ef_search is None:
                return _rows(conn, step)
            previous = set_ef_search(conn, step.ef_search)
            rows = _rows(conn, step)
            if nested:
                set_ef_search(conn, previous)
            return rows


def _fetch_pooled(
    pool: ConnectionPool[psycopg.Connection], step: Fetch, retry: bool = True
) -> list[Any]:
    """On a connection of the pool. One found dead (the server restarted since it was last used)
    costs no error: the pool replaces its dead connections and the statement (read-only) runs
    again, once."""
    with errors(), pool.connection() as borrowed:
        try:
            return _fetch(borrowed, step)
        except DatabaseError:
            if not (retry and borrowed.broken):
                raise
    with errors():
        pool.check()
    return _fetch_pooled(pool, step, retry=False)


def _rows(conn: psycopg.Connection, step: Fetch) -> list[Any]:
    if step.as_dicts:
        with conn.cursor(row_factory=dict_row) as cur:
            return cur.execute(step.statement, step.params).fetchall()
    with conn.cursor() as tuples:
        return tuples.execute(step.statement, step.params).fetchall()


async def _fetch_async(
    conn: psycopg.AsyncConnection | AsyncConnectionPool[psycopg.AsyncConnection], step: Fetch
) -> list[Any]:
    if isinstance(conn, AsyncConnectionPool):
        return await _fetch_pooled_async(conn, step)
    with errors():
        if not step.transaction:
            return await _rows_async(conn, step)
        nested = conn.info.transaction_status != TransactionStatus.IDLE
        async with conn.transaction():
            if step.ef_search is None:
                return await _rows_async(conn, step)
            previous = await set_ef_search_async(conn, step.ef_search)
            rows = await _rows_async(conn, step)
            if nested:
                await set_ef_search_async(conn, previous)
            return rows


async def _fetch_pooled_async(
    pool: AsyncConnectionPool[psycopg.AsyncConnection], step: Fetch, retry: bool = True
) -> list[Any]:
    with errors():
        async with _borrowed(pool) as borrowed:
            try:
                return await _fetch_async(borrowed, step)
            except DatabaseError:
                if not (retry and borrowed.broken):
                    raise
    with errors():
        await pool.check()
    return await _fetch_pooled_async(pool, step, retry=False)


# The give-backs under way (the event loop holds a task only weakly).
_GIVING_BACK: set[asyncio.Task[None]] = set()


@asynccontextmanager
async def _borrowed(
    pool: AsyncConnectionPool[psycopg.AsyncConnection],
) -> AsyncIterator[psycopg.AsyncConnection]:
    """A connection of the pool, as pool.connection() lends one, except that a cancellation (of
    a `pgembed serve` search whose client went away) never reaches psycopg_pool's taking or
    giving back: psycopg_pool 3.3 takes a connection back under its lock, and a borrower
    cancelled while waiting for that lock lost the connection for good (test_pool_cancel.py).
    Cancelled while waiting, the borrower goes at once and the connection, when it comes, goes
    back."""
    taking = asyncio.ensure_future(pool.getconn())
    try:
        conn = await asyncio.shield(taking)
    except asyncio.CancelledError:
        taking.add_done_callback(lambda came: _give_back(pool, came))
        raise
    try:
        yield conn
    finally:
        await asyncio.shield(_put_back(pool, conn))


def _give_back(
    pool: AsyncConnectionPool[psycopg.AsyncConnection],
    taking: asyncio.Future[psycopg.AsyncConnection],
) -> None:
    """A connection that came for a borrower cancelled meanwhile, back to the pool."""
    if not taking.cancelled() and taking.exception() is None:  # else none came (a timeout)
        _put_back(pool, taking.result())


def _put_back(
    pool: AsyncConnectionPool[psycopg.AsyncConnection], conn: psycopg.AsyncConnection
) -> asyncio.Task[None]:
    """pool.putconn(conn) in a task of its own, which no cancellation of its caller stops."""
    giving = asyncio.ensure_future(pool.putconn(conn))
    _GIVING_BACK.add(giving)
    giving.add_done_callback(_GIVING_BACK.discard)
    return giving


async def _rows_async(conn: psycopg.AsyncConnection, step: Fetch) -> list[Any]:
    if step.as_dicts:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(step.statement, step.params)
            return await cur.fetchall()
    async with conn.cursor() as tuples:
        await tuples.execute(step.statement, step.params)
        return await tuples.fetchall()


@contextmanager
def errors() -> Iterator[None]:
    """The helpers' errors as pgembed errors: bad input is a usage error, a missing row NotFound."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from None


class Undefined(NotFoundError):
    """A statement named a table or column that is not there (the helpers' own checks raise
    other codes): a model's table changed under it."""


def translate(exc: psycopg.Error) -> PgembedError:
    state = exc.sqlstate or ""
    message = db.first_line(exc)
    if state in ("42703", "42P01"):  # undefined_column, undefined_table
        return Undefined(message)
    # Data exceptions (a bad filter, k, vector or value); psycopg's own DataError (e.g. a NUL in a
    # text parameter) has no SQLSTATE.
    if state.startswith("22") or isinstance(exc, psycopg.DataError):
        return UsageError(message)
    if state in ("P0002", "42704", "55000"):  # no such row / model / full-text index
        return NotFoundError(message)
    return db.describe(exc)
