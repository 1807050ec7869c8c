"""The search API without HTTP: a request's JSON -> hits, the models served, health; and the
HTTP status of every error (400 bad input, 403 a privilege the role lacks, 404 unknown model or
key, 503 database down or busy).

parse_search maps the JSON to the planner's SearchRequest (search/planner.py), whose plan
plan.execute_async runs on an asyncio pool as the AsyncClient runs it: a connection is borrowed
for each statement, never held while a model loads or a query is encoded, and one found dead is
replaced and the statement run again. Query texts are encoded in batches (search/batching.py:
the requests that wait for the encoder at once share one forward pass), by the light encoder
where it reproduces the model (encode/light.py).
`warm` loads the models before the server takes requests, so the first request is as fast as
the others.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from pgembed import checks, db, defaults, migrate
from pgembed.catalog import naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.errors import (
    DatabaseError,
    NotFoundError,
    PgembedError,
    SchemaError,
    UsageError,
)
from pgembed.search import batching, plan, planner, vectors
from pgembed.search.planner import SearchRequest

log = logging.getLogger("pgembed.serve")
_T = TypeVar("_T")
_E = TypeVar("_E", bound=BaseException)

MAX_K = planner.MAX_K  # as `pgembed query -k`
# Waiting longer than this for a connection means the database is down (or every connection
# busy for that long): the request gets a 503 instead of hanging.
ACQUIRE_TIMEOUT = 5.0
# Connections the server opens at most; a statement beyond it waits for one (ACQUIRE_TIMEOUT).
# A connection is held for one statement at a time, never while a query is encoded.
POOL_SIZE = 8

_FIELDS = {"text", "model", "k", "filter", "hybrid", "similar_to", "ef_search", "row"}


class ApiError(Exception):
    """A request the API refuses, with its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# SearchRequest's rules in this API's terms (planner.RequestError.rule -> message); any other
# broken rule is a 400 with the planner's own message.
_MESSAGES = {
    "source": 'give either "text" or "similar_to" (a row\'s key)',
    "empty": '"text" is empty',
    "hybrid": '"hybrid" needs "text" (it ranks the text\'s words too)',
}


def parse_search(payload: object) -> SearchRequest:
    """The request in a decoded JSON body, or an ApiError(400) that says what is wrong. The JSON's
    types are checked here; the request's rules are SearchRequest's."""
    if not isinstance(payload, dict):
        raise ApiError(400, 'the body must be a JSON object, e.g. {"text": ..., "model": ...}')
    _require_unicode(payload)
    unknown = sorted(set(payload) - _FIELDS)
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r}: use {', '.join(sorted(_FIELDS))}")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, '"model" is required: a model\'s name (see GET /models)')
    text, similar_to = payload.get("text"), payload.get("similar_to")
    if text is not None and not isinstance(text, str):
        raise ApiError(400, '"text" must be a string')
    if similar_to is not None and (
        isinstance(similar_to, bool) or not isinstance(similar_to, str | int | Decimal)
    ):  # a number as written (loads_exact): a float key's hit reads back
        raise ApiError(400, '"similar_to" must be a row\'s key, a string or a number')
    hybrid = payload.get("hybrid", False)
    if not isinstance(hybrid, bool):
        raise ApiError(400, '"hybrid" must be true or false')
    if not isinstance(payload.get("row", False), bool):
        raise ApiError(400, '"row" must be true or false')
    filter = payload.get("filter")
    if filter is not None and not isinstance(filter, dict):
        raise ApiError(400, '"filter" must be a JSON object, e.g. {"rating": {"$gte": 4}}')
    k, ef_search = _bounded(payload, "k", 10), _bounded(payload, "ef_search", None)
    try:
        return SearchRequest(
            model,
            text=text,
            similar_to=None if similar_to is None else str(similar_to),
            k=k,
            filter=filter,
            hybrid=hybrid,
            ef_search=ef_search,
        )
    except planner.RequestError as exc:
        raise ApiError(400, _MESSAGES.get(exc.rule, str(exc))) from None


def _require_unicode(payload: object) -> None:
    """JSON may escape a lone surrogate ("\\ud800"), which no database text can hold: refused
    here in any field, as a text's is by SearchRequest."""
    try:
        json.dumps(payload, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        raise ApiError(
            400,
            f"the body holds a lone surrogate ({bad.encode('unicode_escape').decode()}): "
            "not valid Unicode",
        ) from None
    except (ValueError, RecursionError):
        raise ApiError(400, "the request is nested too deeply") from None


def _bounded(payload: Mapping[str, Any], name: str, default: int | None) -> Any:
    value = payload.get(name, default)
    if value is None and default is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_K:
        raise ApiError(400, f'"{name}" must be an integer from 1 to {MAX_K}')
    return value


def status_of(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and one-line message for an error raised while answering."""
    if isinstance(exc, ApiError):
        return exc.status, exc.message
    if isinstance(exc, psycopg.OperationalError):  # connection lost, or none within the timeout
        return 503, f"database unavailable: {db.first_line(exc)}"
    cause = exc.__context__  # the driver's error, under plan.errors' translation
    if isinstance(exc, psycopg.Error):
        exc, cause = plan.translate(exc), exc
    if isinstance(exc, DatabaseError) and isinstance(cause, psycopg.OperationalError):
        return 503, f"database unavailable: {db.first_line(cause)}"  # via plan.errors
    if isinstance(exc, DatabaseError) and _sqlstate(cause) == "42501":
        # A privilege this server's role lacks (a filtered column it may not read): the operator's
        # to grant; not 503, which clients retry.
        return 403, db.first_line(cause or exc)
    if isinstance(exc, DatabaseError) and _is_request_error(cause):
        return 400, db.first_line(
            cause or exc
        )  # e.g. a filter comparing a column with the wrong type
    if isinstance(exc, RecursionError):  # a filter nested too deeply to encode
        return 400, "the request is nested too deeply"
    if isinstance(exc, UsageError):
        return 400, str(exc)
    if isinstance(exc, NotFoundError):
        return 404, str(exc)
    if isinstance(cause, plan.Undefined):  # a model whose table changed: no retry mends it
        return 500, str(exc)
    if isinstance(exc, DatabaseError | SchemaError):
        return 503, str(exc)
    if isinstance(exc, PgembedError):
        return 500, str(exc)
    return 500, "internal error (the server's log has the details)"


# SQLSTATE classes of errors the request caused, not the database's state: 22 data exception,
# 42 syntax error or access rule violation (an operator that does not exist for the filter's
# types, ...), except 42501 (a privilege this server's role lacks: the operator's to fix).
def _sqlstate(cause: BaseException | None) -> str | None:
    return cause.sqlstate if isinstance(cause, psycopg.Error) else None


def _is_request_error(cause: BaseException | None) -> bool:
    if not isinstance(cause, psycopg.Error) or cause.sqlstate is None:
        return False
    return cause.sqlstate[:2] in ("22", "42") and cause.sqlstate != "42501"


def timed_out(cancelled: psycopg.errors.QueryCanceled, ran: float, limit: float) -> bool:
    """Whether a cancelled statement was stopped by the statement timeout (`limit` seconds, 0:
    none), not by an administrator's pg_cancel_backend: both are SQLSTATE 57014. PostgreSQL
    says which in its message, in English unless the server's lc_messages is another language;
    then a request that ran at least `limit` seconds (`ran`) is taken for the timeout."""
    said = db.first_line(cancelled)
    if "statement timeout" in said:
        return True
    if "user request" in said:
        return False
    return 0 < limit <= ran


def _found(exc: BaseException, kind: type[_E]) -> _E | None:
    """`exc` or the first error of its chain (a translation's cause or context) of that kind."""
    seen: BaseException | None = exc
    while seen is not None and not isinstance(seen, kind):
        seen = seen.__cause__ or seen.__context__
    return seen


def model_info(spec: ModelSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "table": spec.qualified_table,
        "column": spec.text_column,
        "columns": list(spec.text_columns),
        "key": spec.key_column,
        "dimensions": spec.dimensions,
        "pooling": spec.pooling,
        "model_ref": spec.model_ref,
    }


class Api:
    """What the server answers, over an asyncio pool of connections, in one event loop: `open`
    it there (the server does, at its start) and `aclose` it there.

    `models`: the only models served (each must exist); empty: every model of the catalog,
    those added later included (loaded on their first search). Query texts are encoded in
    batches (search/batching.py) of at most `max_batch`, an idle encoder waiting at most
    `max_wait` seconds for companions. A statement that runs longer than `statement_timeout`
    seconds (0: no limit) is cancelled, so that a search reading most of a big table (a hybrid
    text of a word most rows have) cannot hold one of the pool's connections for minutes.
    """

    def __init__(
        self,
        url: str,
        models: Sequence[str] = (),
        *,
        max_batch: int = batching.MAX_BATCH,
        max_wait: float = batching.MAX_WAIT,
        statement_timeout: float = defaults.SERVE_STATEMENT_TIMEOUT,
    ) -> None:
        self.statement_timeout = checks.number(
            "statement_timeout", statement_timeout, 0, defaults.SERVE_STATEMENT_TIMEOUT_MAX
        )
        self._only = tuple(models)
        with db.connection(url) as conn:
            migrate.require_current(conn)
            self._specs = [registry.get(conn, name) for name in self._only] or _servable(conn)
        for spec in self._specs:
            if spec.shadow_of is not None:
                raise UsageError(f"model {spec.name!r} is a reindex's shadow: serve the model")
        self.loaded: list[str] = []
        self.last_used: str | None = None  # the model of the last search answered (the page's)
        self.batcher = batching.QueryBatcher(max_batch, max_wait, light=True)
        self._url = url
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection] | None = None
        self.acquire_timeout = ACQUIRE_TIMEOUT  # what plan.execute_async waits for a connection

    async def open(self) -> None:
        """Open the pool, in the event loop that serves (its connections are made meanwhile)."""
        pool = db.async_pool(self._url, POOL_SIZE, statement_timeout=self.statement_timeout)
        pool.timeout = self.acquire_timeout
        await pool.open()
        self._pool = pool

    async def aclose(self) -> None:
        await self.batcher.close()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def warm(self) -> None:
        """Load each model and encode a first query, so the first request is as fast as any."""
        for spec in self._specs:
            started = time.perf_counter()
            with embedder.light_encoder():
                vectors.embed_query(spec, "warm up")
            self.loaded.append(spec.name)
            log.info("model %s ready in %.1f s", spec.name, time.perf_counter() - started)

    async def search(self, payload: object) -> dict[str, Any]:
        """POST /search."""
        return await self._said_busy(self._search(payload))

    async def _said_busy(self, work: Awaitable[_T]) -> _T:
        """`work`, with no connection free in time said as the server's being busy (every
        connection taken), not as the database being unavailable, and a statement the server
        cancelled (the statement timeout) as a 504: the same request would time out again."""
        started = time.monotonic()
        try:
            return await work
        except Exception as exc:
            cancelled = _found(exc, psycopg.errors.QueryCanceled)
            ran = time.monotonic() - started
            if cancelled is not None and timed_out(cancelled, ran, self.statement_timeout):
                limit = f"{self.statement_timeout:g} s" if self.statement_timeout else "none"
                raise ApiError(
                    504,
                    f"the search was stopped: {db.first_line(cancelled)} (the server's statement "
                    f"timeout: {limit}; a filter, a smaller k or fewer common words in a hybrid "
                    "text make it shorter)",
                ) from None
            if self._all_busy(exc):
                pool = self._ready()
                stats = pool.get_stats()  # in the log: what held the connections, and how long
                log.warning(
                    "no database connection free within %g s: %s", self.acquire_timeout, stats
                )
                raise ApiError(
                    503,
                    f"the server is busy: all {pool.max_size} of its database connections are "
                    f"in use (none free within {self.acquire_timeout:g} s), by other searches or "
                    "being made again to a database that is down: retry shortly",
                ) from None
            raise

    def _all_busy(self, exc: BaseException) -> bool:
        """Whether `exc` is no connection within the timeout (plan.errors' translation of it too)
        while every one of the pool's connections is taken. The pool counts a connection it is
        making again (after the database went away) as taken, so the message names both."""
        pool = self._pool
        if _found(exc, PoolTimeout) is not None and pool is not None:
            stats = pool.get_stats()
            in_use = stats.get("pool_size", 0) - stats.get("pool_available", 0)
            return in_use >= pool.max_size
        return False

    async def _search(self, payload: object) -> dict[str, Any]:
        request = parse_search(payload)
        rows = isinstance(payload, dict) and payload.get("row", False)
        self._require_served(request.model)
        started = time.perf_counter()
        pool = self._ready()
        found = await plan.execute_async(pool, _search_plan(request), self.batcher.embed)
        hits = [planner.hit_fields(hit) for hit in found]
        if rows and hits:
            spec = await plan.execute_async(pool, planner.spec_plan(request.model))
            await self._add_rows(pool, spec, hits)
        self.last_used = request.model
        return {
            "model": request.model,
            "hits": hits,
            "took_ms": round((time.perf_counter() - started) * 1000, 2),
        }

    async def models(self) -> dict[str, Any]:
        """GET /models."""
        return {"models": [model_info(spec) for spec in await self.served()]}

    async def served(self) -> list[ModelSpec]:
        """The models this server answers for, by name (a reindex's shadow is not one)."""
        step = plan.Fetch(registry.ALL, as_dicts=True)
        rows = await self._said_busy(plan.execute_async(self._ready(), _fetch_plan(step)))
        specs = [registry.from_row(row) for row in rows]
        if self._only:
            specs = [spec for spec in specs if spec.name in self._only]
        return [spec for spec in specs if spec.shadow_of is None]

    async def health(self) -> dict[str, Any]:
        """GET /healthz: the database answers."""
        await self._said_busy(
            plan.execute_async(self._ready(), _fetch_plan(plan.Fetch("SELECT 1")))
        )
        return {"status": "ok", "models": self.loaded}

    def metrics(self) -> dict[str, Any]:
        """GET /metrics: what the query batcher did (search/batching.py)."""
        return {"batching": dataclasses.asdict(self.batcher.stats)}

    def _ready(self) -> AsyncConnectionPool[psycopg.AsyncConnection]:
        if self._pool is None:
            raise ApiError(503, "the server is starting or stopping")
        return self._pool

    def _require_served(self, name: str) -> None:
        if self._only and name not in self._only:
            raise registry.unknown(name, self._only, f"this server serves {', '.join(self._only)}")

    async def _add_rows(
        self,
        pool: AsyncConnectionPool[psycopg.AsyncConnection],
        spec: ModelSpec,
        hits: list[dict[str, Any]],
    ) -> None:
        """Each hit's "row": its row's other columns that this server's role may read (not the
        key, the text columns or the vectors), read under the same row security as the search."""
        table = naming.table(spec)
        names = await plan.execute_async(
            pool, _fetch_plan(plan.Fetch(registry.ROW_COLUMNS, (table.as_string(),)))
        )
        hidden = {spec.key_column, *spec.text_columns}
        columns = [name for (name,) in names if name not in hidden]
        if not columns:
            for hit in hits:
                hit["row"] = {}
            return
        # Matched to the hits by position, not by text: PostgreSQL's text of a key (a
        # timestamptz, a float) need not be Python's str() of it, which its input still reads
        # (a bytea's is already its text: shown_key).
        statement = sql.SQL(
            "SELECT k.i, pg_catalog.jsonb_build_object({pairs}) "
            "FROM pg_catalog.unnest(%s::text[]::{type}[]) WITH ORDINALITY AS k(v, i) "
            "JOIN {table} t ON {matches}"
        ).format(
            matches=naming.key_is(spec, "t", sql.SQL("k.v")),
            pairs=sql.SQL(", ").join(
                sql.SQL("{}, t.{}").format(sql.Literal(c), sql.Identifier(c)) for c in columns
            ),
            table=naming.only(spec),
            type=naming.key_type(spec),
        )
        keys = [str(hit["key"]) for hit in hits]
        found = await plan.execute_async(pool, _fetch_plan(plan.Fetch(statement, (keys,))))
        by_position = dict(found)
        for i, hit in enumerate(hits, start=1):
            hit["row"] = by_position.get(i, {})


def _servable(conn: psycopg.Connection) -> list[ModelSpec]:
    return [spec for spec in registry.all_models(conn) if spec.shadow_of is None]


def _fetch_plan(step: plan.Fetch) -> plan.Plan[list[Any]]:
    rows: list[Any] = yield step
    return rows


def _search_plan(request: SearchRequest) -> plan.Plan[list[planner.Hit] | list[planner.HybridHit]]:
    """The planner's plan for the request, on the model's current row (never a shadow's)."""
    spec = yield from planner.spec_plan(request.model)
    if spec.shadow_of is not None:
        raise NotFoundError(f"unknown model {request.model!r}: it is a reindex's shadow")
    return (yield from planner.plan_for(spec, request))
