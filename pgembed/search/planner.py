"""One search request, one planner: every front end (the CLI's `pgembed query`, `pgembed
serve`, `Client`, `AsyncClient`, the SQLAlchemy integration) builds a `SearchRequest` and runs
`plan(request)` through the SQL helpers pgembed.search / similar / hybrid_search, joining the
rows' text in the same statement.

`SearchRequest` is the one place for the rules of a request (one of text, vector or similar_to;
a text that a model can read; hybrid needs text; k; the filter's shape): a broken one raises
`RequestError` (a UsageError), whose `rule` lets a front end word it in its own terms.

Each search is a *plan* (plan.py): a generator that yields the steps it needs and receives their
results. It holds every decision (which helper, when to check what, when to search again after a
reindex switch) and does no I/O itself, so one plan serves the sync and the async driver.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, LiteralString, TypeVar

import psycopg
from pgvector import Vector
from psycopg import sql
from psycopg.types.json import Jsonb

from pgembed import checks, defaults, sqlfiles, texts
from pgembed.catalog import naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.encode.embedder import Vectors
from pgembed.encode.settings import settings_of
from pgembed.errors import DatabaseError, NotFoundError, UsageError
from pgembed.search.plan import Embed, Fetch, Plan, Undefined, execute
from pgembed.search.vectors import warm

_T = TypeVar("_T")

# The most rows `pgembed query` and `pgembed serve` return (a Python caller may ask for more).
MAX_K = 1000
# Python's searches are not held to MAX_K (the ORM helpers search 4 and 16 times deeper), only to
# what the SQL functions' integer takes; ef_search to pgvector's range.
K_LIMIT = 2**31 - 1
EF_SEARCH_RANGE = (1, 1000)
# A filter number's exponent at most: PostgreSQL's numeric, which a jsonb number is, holds 131072
# digits before the point and 16383 after.
_NUMERIC_DIGITS = 16_000

# column -> value, or column -> {"$eq"|"$ne"|"$gt"|"$gte"|"$lt"|"$lte"|"$in": value}
Filter = Mapping[str, Any]


@dataclass(frozen=True)
class Hit:
    """A row found by vector search: its key, cosine similarity to the query, and its text.

    `key` is the key column's value in its own type: int for an integer key, str for text,
    uuid.UUID for uuid, and so on.
    """

    key: Any
    similarity: float
    text: str


def hit_fields(hit: Hit | HybridHit) -> dict[str, Any]:
    """A hit's fields for JSON (`pgembed query --json`, `pgembed serve`), its key as shown."""
    return dataclasses.asdict(hit) | {"key": shown_key(hit.key)}


def shown_key(key: Any) -> Any:
    """A hit's key for JSON and the terminal: a bytea's as PostgreSQL writes it (`\\x` and hex),
    which --similar-to and similar_to read back, where Python's str() gives b'...'. Others as
    they are."""
    return "\\x" + key.hex() if isinstance(key, bytes) else key


@dataclass(frozen=True)
class HybridHit:
    """A row found by hybrid search: its key (in its own type), reciprocal-rank-fusion score, and
    its text."""

    key: Any
    score: float
    text: str


# --- the request ------------------------------------------------------------------------------


class RequestError(UsageError):
    """A request that breaks one of SearchRequest's rules. `rule` names it, so a front end can say
    it in its own terms (serve's JSON fields, the CLI's arguments): "source" (not exactly one of
    text, vector, similar_to), "empty" (a text without words), "text" (any other bad text),
    "hybrid" (hybrid without text), "k", "filter", "model", "key", "ef_search"."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class SearchRequest:
    """One search, whichever front end asks: the rows of model `model` nearest to `text` (plain or
    `hybrid`), to a query `vector`, or to the row whose key is `similar_to` (itself excluded);
    at most `k`, only rows matching `filter` (column -> value or {"$op": value}), with
    `ef_search` for this search alone. Checked when made (RequestError)."""

    model: str
    text: str | None = None
    vector: Vectors | None = None
    similar_to: object = None
    k: int = 10
    filter: Filter | None = None
    hybrid: bool = False
    ef_search: int | None = None

    def __post_init__(self) -> None:
        given = [v for v in (self.text, self.vector, self.similar_to) if v is not None]
        if len(given) != 1:
            raise RequestError("source", "give exactly one of text, vector or similar_to")
        if self.hybrid and self.text is None:
            raise RequestError("hybrid", "hybrid search needs text (it ranks the text's words too)")
        if self.text is not None:
            require_text(self.text)
        if not isinstance(self.model, str):
            given = checks.shown(self.model)
            raise RequestError("model", f"the model name must be a string, not {given}")
        if self.similar_to is not None:
            _require_key(self.similar_to)
        # numpy's integers pass too, stored as int, which the driver sends
        object.__setattr__(self, "k", _integer("k", self.k, 1, K_LIMIT))
        if self.ef_search is not None:
            ef_search = _integer("ef_search", self.ef_search, *EF_SEARCH_RANGE)
            object.__setattr__(self, "ef_search", ef_search)
        if self.filter is not None and not isinstance(self.filter, Mapping):
            raise RequestError(
                "filter", "a filter must be a mapping of column -> value or {'$op': value}"
            )
        if self.filter is not None:
            filter_json(dict(self.filter))


def filter_json(filter: object) -> str:
    """A filter as the SQL reads it: its values are cast from their text to the column's type, so
    dates and times go as ISO text, UUIDs as text, decimals as numbers with their own digits
    (jsonb keeps them: it stores a number as numeric). What JSON or the server cannot hold is a
    RequestError here, not a driver's error at the search."""
    _require_filter_strings(filter)
    try:
        return _filter_text(filter)
    except ValueError:
        raise RequestError("filter", "a filter value is NaN or infinite") from None
    except TypeError:  # a key that is not a string
        raise RequestError("filter", "a filter's keys must be column names or operators") from None


def _filter_text(value: object) -> str:
    """json.dumps, but for a Decimal: a JSON number written with its digits, not a float's."""
    if isinstance(value, Decimal):
        return _decimal_number(value)
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            raise TypeError("a key that is not a string")
        items = (f"{json.dumps(key)}: {_filter_text(item)}" for key, item in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_filter_text(item) for item in value) + "]"
    return json.dumps(value, default=_filter_value, allow_nan=False)


def _decimal_number(value: Decimal) -> str:
    if not value.is_finite():
        raise ValueError("not finite")
    if abs(value.adjusted()) > _NUMERIC_DIGITS:
        raise RequestError("filter", f"a filter number is out of range: {checks.shown(value)}")
    return str(value)  # JSON's number syntax: 4.50, -0, 1E+400, 1E-7


def _filter_value(value: object) -> str:
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        # The helpers run with timezone UTC: a timestamp column compares UTC wall-clock time, as
        # PostgreSQL compares it with a timestamptz (the helpers read its values as one).
        return value.astimezone(datetime.UTC).isoformat()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise RequestError(
        "filter",
        "a filter value must be a string, number, boolean, None, date, time, Decimal, UUID or a "
        f"list of them, not {type(value).__name__}",
    )


def _require_filter_strings(value: object) -> None:
    """No NUL and no lone surrogate, which a jsonb cannot hold, in a key or a value."""
    if isinstance(value, str):
        if "\x00" in value:
            raise RequestError("filter", "a filter value contains a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError("filter", "a filter value is not valid Unicode") from None
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _require_filter_strings(key)
            _require_filter_strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _require_filter_strings(item)


def _jsonb(filter: Mapping[str, Any] | None) -> Jsonb:
    return Jsonb(dict(filter or {}), dumps=filter_json)


def _integer(rule: str, value: object, low: int, high: int) -> int:
    try:
        return checks.integer(rule, value, low, high)
    except UsageError as exc:
        raise RequestError(rule, str(exc)) from None


def _require_key(key: object) -> None:
    """A row's key travels as text (the SQL casts it to the key column's type)."""
    try:
        str(key).encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError("key", "the row key is not valid Unicode (a lone surrogate)") from None


def require_text(text: str) -> None:
    """A query text must have words (an empty one would return arbitrary rows), fit a model's
    reading and travel to the server: the one check of a query text."""
    if not isinstance(text, str):
        raise RequestError("text", f"the query text must be a string, not {type(text).__name__}")
    if not texts.has_text(text):  # "" or only whitespace and invisible characters
        raise RequestError("empty", "the query text is empty")
    if len(text) > defaults.MAX_QUERY_CHARS:
        raise RequestError(
            "text",
            f"the query text has {len(text)} characters; at most {defaults.MAX_QUERY_CHARS} "
            "(a model reads only its first few hundred word pieces)",
        )
    if "\x00" in text:
        raise RequestError("text", "the query text contains a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(
            "text", "the query text is not valid Unicode (a lone surrogate)"
        ) from None


# --- the planner -------------------------------------------------------------------------------


def plan(request: SearchRequest) -> Plan[list[Hit] | list[HybridHit]]:
    """The request's search, on the model's current catalog row."""
    spec = yield from spec_plan(request.model)
    return (yield from plan_for(spec, request))


def plan_for(spec: ModelSpec, request: SearchRequest) -> Plan[list[Hit] | list[HybridHit]]:
    """The request's search on this spec of its model: the one choice between the plans. A
    table or column the model reads that is gone (renamed, dropped) is said of the model."""
    try:
        if request.similar_to is not None:
            return (yield from _similar_plan(spec, request))
        if request.vector is not None:
            return (yield from _nearest_plan(spec, request.vector, request))
        if request.hybrid:
            return (yield from _hybrid_plan(spec, request))
        return (yield from _query_plan(spec, request))
    except Undefined as exc:  # the operator's to mend (not NotFound: no request can fix it)
        raise DatabaseError(
            f"model {spec.name!r} cannot read its table: {exc} (renamed or dropped since "
            "`model add`: `pgembed status` says what to do)"
        ) from None


def embed_plan(model: str, text: str) -> Plan[Vectors]:
    """The query vector of `text` with every setting of model `model` (its query prefix, pooling,
    normalisation): the vector a search of `text` compares the rows with (`pgembed embed`)."""
    require_text(text)
    spec = yield from spec_plan(model)
    vector: Vectors = yield Embed(spec, text)
    return vector


def spec_plan(name: str) -> Plan[ModelSpec]:
    """The model's catalog row (NotFoundError if there is none)."""
    rows = yield Fetch(registry.BY_NAME, (name,), as_dicts=True)
    if rows:
        return registry.from_row(rows[0])
    known = yield Fetch(registry.NAMES)  # for "did you mean"
    raise registry.unknown(name, [row[0] for row in known])


def _nearest_plan(spec: ModelSpec, vector: Vectors, request: SearchRequest) -> Plan[list[Hit]]:
    call = sql.SQL("pgembed.search(%(model)s, %(q)s, %(k)s::integer, %(filter)s)")
    params = {"model": spec.name, "q": Vector(vector), **_common(request)}
    rows = yield _hits(spec, call, "similarity", params, request.ef_search)
    if not rows:
        yield from _require_vectors(spec)
    return [Hit(key, float(value), text) for key, value, text in rows]


def _query_plan(spec: ModelSpec, request: SearchRequest) -> Plan[list[Hit]]:
    assert request.text is not None  # plan_for checks it
    text = request.text

    def attempt(current: ModelSpec) -> Plan[list[Hit]]:
        yield from _before_the_model(current)
        vector = yield Embed(current, text)
        return (yield from _nearest_plan(current, vector, request))

    return (yield from _in_one_space(spec, attempt))


def _similar_plan(spec: ModelSpec, request: SearchRequest) -> Plan[list[Hit]]:
    call = sql.SQL("pgembed.similar(%(model)s, %(key)s::text, %(k)s::integer, %(filter)s)")
    params = {"model": spec.name, "key": str(request.similar_to), **_common(request)}
    rows = yield _hits(spec, call, "similarity", params, request.ef_search)
    return [Hit(found, float(value), text) for found, value, text in rows]


def _hybrid_plan(spec: ModelSpec, request: SearchRequest) -> Plan[list[HybridHit]]:
    assert request.text is not None  # SearchRequest checks it
    text = request.text
    call = sql.SQL(
        "pgembed.hybrid_search(%(model)s, %(q)s, %(text)s::text, %(k)s::integer, %(filter)s)"
    )

    def attempt(current: ModelSpec) -> Plan[list[HybridHit]]:
        yield from _before_the_model(current, fulltext=True)
        vector = yield Embed(current, text)
        params = {"model": current.name, "q": Vector(vector), "text": text, **_common(request)}
        rows = yield _hits(current, call, "score", params, request.ef_search)
        if not rows:
            yield from _require_vectors(current)
        return [HybridHit(key, float(value), shown) for key, value, shown in rows]

    return (yield from _in_one_space(spec, attempt))


def _common(request: SearchRequest) -> dict[str, Any]:
    filter = None if request.filter is None else _jsonb(request.filter)
    return {"k": request.k, "filter": filter}


def _in_one_space(spec: ModelSpec, attempt: Callable[[ModelSpec], Plan[_T]]) -> Plan[_T]:
    """attempt(spec), again with the current spec if a reindex switched the model meanwhile.

    The query vector was then made for the previous version: a query never meets the other
    version's vectors.
    """
    while True:
        try:
            result = yield from attempt(spec)
        except UsageError:  # e.g. other dimensions since the switch
            current = yield from spec_plan(spec.name)
            if registry.same_space(current, spec):
                raise
        else:
            current = yield from spec_plan(spec.name)
            if registry.same_space(current, spec):
                return result
        spec = current


def _before_the_model(spec: ModelSpec, *, fulltext: bool = False) -> Plan[None]:
    """Until this process has embedded a query with the model's settings (its model may not be
    loaded yet: seconds), check first what needs no model, in one cheap statement: a missing
    full-text index (hybrid), no vectors at all. Once the model is loaded, a search costs no
    extra statement: the helper reports a missing index, and an empty result is explained after
    the fact (_require_vectors)."""
    if settings_of(spec) in warm:
        return
    statement = sql.SQL(
        "SELECT EXISTS (SELECT 1 FROM {table} WHERE {column} IS NOT NULL), "
        "pg_catalog.to_regclass(pg_catalog.format('%%I.%%I', %(schema)s::text, %(index)s::text))"
        " IS NOT NULL"
    ).format(table=naming.only(spec), column=sql.Identifier(spec.embedding_column))
    names = {"schema": spec.table_schema, "index": naming.fulltext_index_name(spec)}
    [(has_vectors, has_index)] = yield Fetch(statement, names)
    if fulltext and not has_index:  # the helper's own message (pgembed._hybrid_v1)
        raise NotFoundError(
            f"model {spec.name} has no full-text index: run `pgembed model fulltext {spec.name}`"
        )
    if not has_vectors:
        yield from _no_vectors(spec)


def _require_vectors(spec: ModelSpec) -> Plan[None]:
    [(has_vectors,)] = yield Fetch(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {} IS NOT NULL)").format(
            naming.only(spec), sql.Identifier(spec.embedding_column)
        )
    )
    if not has_vectors:
        yield from _no_vectors(spec)


def _no_vectors(spec: ModelSpec) -> Plan[None]:
    """Why a model has no vectors: no sync yet, or a `model add` that did not finish (its rows
    may never have been queued). No sync yet is not an error under row-level security that
    applies to this role: its policy may show it no row with a vector, and then it finds none."""
    rows = yield Fetch(sqlfiles.get("catalog", "model_setup"), {"name": spec.name})
    if rows and str(rows[0][0]).startswith("adding"):
        raise NotFoundError(
            f"model {spec.name!r} is not completely set up: unless a `pgembed model add "
            f"{spec.name}` is running, run it again to finish"
        )
    [(hidden,)] = yield Fetch(
        "SELECT pg_catalog.row_security_active(pg_catalog.to_regclass("
        "pg_catalog.format('%%I.%%I', %s::pg_catalog.text, %s::pg_catalog.text)))",
        (spec.table_schema, spec.table_name),
    )
    if hidden:
        return
    raise NotFoundError(f"model {spec.name!r} has no vectors yet: run `pgembed sync`")


def _hits(
    spec: ModelSpec,
    call: sql.Composable,
    value: LiteralString,
    params: dict[str, Any],
    ef_search: int | None,
) -> Fetch:
    """A helper's hits with each row's key (in the key column's own type) and text, in one
    statement, best first: a helper's relaxed-order index scan (with a filter) may return
    near-ties out of order, so every front end sorts here (ties keep the helper's order)."""
    statement = sql.SQL(
        "SELECT t.{key}, h.{value}, {text} "
        "FROM {call} WITH ORDINALITY AS h(key, {value}, n) "
        "JOIN {table} t ON {matches} "
        "ORDER BY h.{value} DESC, h.n"
    ).format(
        value=sql.Identifier(value),
        text=naming.text_expression(spec, "t"),
        call=call,
        table=naming.only(spec),
        key=sql.Identifier(spec.key_column),
        matches=naming.key_is(spec, "t", sql.SQL("h.key::{}").format(naming.key_type(spec))),
    )
    return Fetch(statement, params, transaction=True, ef_search=ef_search)


# --- the same on one synchronous connection (the CLI, the demo, tests) ------------------------


def run(conn: psycopg.Connection, request: SearchRequest) -> list[Hit] | list[HybridHit]:
    """The request's search on one connection."""
    return execute(conn, plan(request))


def query(
    conn: psycopg.Connection,
    spec: ModelSpec,
    text: str,
    k: int = 10,
    filter: Filter | None = None,
    *,
    ef_search: int | None = None,
) -> list[Hit]:
    """Embed `text` with the model's settings and search (pgembed.search)."""
    request = SearchRequest(spec.name, text=text, k=k, filter=filter, ef_search=ef_search)
    return execute(conn, _query_plan(spec, request))


def filter_note(conn: psycopg.Connection, request: SearchRequest) -> str | None:
    """Why the request's filter may match no row, when the statistics can tell: a text value no
    row has, with the column's values (pgembed.filter_note); else None."""
    if not request.filter:
        return None
    return execute(conn, _note_plan("SELECT pgembed.filter_note(%s, %s)", request))


def filter_index_note(conn: psycopg.Connection, request: SearchRequest) -> str | None:
    """The filtered columns no index leads with, when the model's table is big enough for a
    selective filter on them to scan it whole, with the CREATE INDEX that helps
    (pgembed.filter_index_note); else None."""
    if not request.filter:
        return None
    return execute(conn, _note_plan("SELECT pgembed.filter_index_note(%s, %s)", request))


def _note_plan(statement: str, request: SearchRequest) -> Plan[str | None]:
    """One of the SQL notes on a filter (a constant statement of the model and the filter)."""
    rows = yield Fetch(statement, (request.model, _jsonb(request.filter)))
    return rows[0][0] if rows else None


def loads_exact(text: str | bytes) -> Any:
    """JSON whose fractions and exponents are Decimals, not floats: a filter value keeps the digits
    it was written with (a float reads 4.50000000000000001 as 4.5 and 1e400 as infinity), and
    goes to the server as written (filter_json). A number no Decimal holds is a ValueError."""
    return json.loads(text, parse_float=_decimal)


def _decimal(text: str) -> Decimal:
    try:
        return Decimal(text)
    except ArithmeticError:  # decimal.InvalidOperation: an exponent past any Decimal's
        raise ValueError(f"the number {checks.shown(text)} is out of range") from None


def parse_filter(text: str | None) -> dict[str, Any] | None:
    """A --filter option: a JSON object, or a usage error that fits on one line."""
    if text is None:
        return None
    try:
        value = loads_exact(text)
    except ValueError as exc:  # json.JSONDecodeError, or a number out of range
        raise UsageError(f"--filter is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError('--filter must be a JSON object, e.g. \'{"rating": {"$gte": 4}}\'')
    return value
