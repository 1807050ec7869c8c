"""Query text -> nearest rows, through the SQL helpers pgembed.search / similar / hybrid_search.

SQL, the CLI and the Python Client share one code path: these functions embed the query with
exactly the model's settings and call the helpers, joining the rows' text in the same statement.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, LiteralString, TypeVar

import psycopg
from pgvector import Vector
from psycopg import sql
from psycopg.types.json import Jsonb

from pgembed import db, defaults
from pgembed.catalog import naming, registry
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.embedder import Vectors
from pgembed.errors import NotFoundError, PgembedError, UsageError
from pgembed.lifecycle import models

_T = TypeVar("_T")

# column -> value, or column -> {"$eq"|"$ne"|"$gt"|"$gte"|"$lt"|"$lte"|"$in": value}
Filter = Mapping[str, Any]


@dataclass(frozen=True)
class Hit:
    """A row found by vector search: its key, cosine similarity to the query, and its text."""

    key: str
    similarity: float
    text: str


@dataclass(frozen=True)
class HybridHit:
    """A row found by hybrid search: its key, reciprocal-rank-fusion score, and its text."""

    key: str
    score: float
    text: str


def embed_query(spec: ModelSpec, text: str) -> Vectors:
    """The query's vector with the model's exact settings; repeated texts come from an LRU cache."""
    return _query_vector(models.settings_of(spec), text)


@functools.lru_cache(maxsize=defaults.QUERY_CACHE_SIZE)
def _query_vector(settings: embedder.Settings, text: str) -> Vectors:
    vector = embedder.get(settings).encode_queries([text]).reshape(-1)
    vector.flags.writeable = False  # shared by every caller that asks for this text
    return vector


def query_cache_info() -> functools._CacheInfo:
    return _query_vector.cache_info()


def nearest(
    conn: psycopg.Connection,
    spec: ModelSpec,
    vector: Vectors,
    k: int = 10,
    filter: Filter | None = None,
    *,
    ef_search: int | None = None,
) -> list[Hit]:
    """The k rows nearest to `vector`, through pgembed.search (HNSW index)."""
    call = sql.SQL("pgembed.search(%(model)s, %(q)s, %(k)s::integer, %(filter)s)")
    params = {"model": spec.name, "q": Vector(vector), "k": k, "filter": _jsonb(filter)}
    rows = _hits(conn, spec, call, "similarity", params, ef_search)
    if not rows:
        _require_vectors(conn, spec)
    return [Hit(key, float(value), text) for key, value, text in rows]


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
    return _in_one_space(
        conn,
        spec,
        lambda current: nearest(
            conn, current, embed_query(current, text), k, filter, ef_search=ef_search
        ),
    )


def _in_one_space(
    conn: psycopg.Connection, spec: ModelSpec, attempt: Callable[[ModelSpec], _T]
) -> _T:
    """attempt(spec), again with the current spec if a reindex switched the model meanwhile.

    The query vector was then made for the previous version: a query never meets the other
    version's vectors.
    """
    while True:
        try:
            result = attempt(spec)
        except UsageError:  # e.g. other dimensions since the switch
            current = registry.get(conn, spec.name)
            if registry.same_space(current, spec):
                raise
        else:
            current = registry.get(conn, spec.name)
            if registry.same_space(current, spec):
                return result
        spec = current


def similar(
    conn: psycopg.Connection,
    spec: ModelSpec,
    key: str | int,
    k: int = 10,
    filter: Filter | None = None,
    *,
    ef_search: int | None = None,
) -> list[Hit]:
    """The k rows nearest to the row with this key, the row itself excluded (pgembed.similar)."""
    call = sql.SQL("pgembed.similar(%(model)s, %(key)s::text, %(k)s::integer, %(filter)s)")
    params = {"model": spec.name, "key": str(key), "k": k, "filter": _jsonb(filter)}
    rows = _hits(conn, spec, call, "similarity", params, ef_search)
    return [Hit(key, float(value), text) for key, value, text in rows]


def hybrid(
    conn: psycopg.Connection,
    spec: ModelSpec,
    text: str,
    k: int = 10,
    filter: Filter | None = None,
    *,
    ef_search: int | None = None,
) -> list[HybridHit]:
    """Reciprocal-rank fusion of vector and full-text rankings (pgembed.hybrid_search)."""
    call = sql.SQL(
        "pgembed.hybrid_search(%(model)s, %(q)s, %(text)s::text, %(k)s::integer, %(filter)s)"
    )

    def attempt(current: ModelSpec) -> list[HybridHit]:
        params = {
            "model": current.name,
            "q": Vector(embed_query(current, text)),
            "text": text,
            "k": k,
            "filter": _jsonb(filter),
        }
        rows = _hits(conn, current, call, "score", params, ef_search)
        if not rows:
            _require_vectors(conn, current)
        return [HybridHit(key, float(value), shown) for key, value, shown in rows]

    return _in_one_space(conn, spec, attempt)


def _hits(
    conn: psycopg.Connection,
    spec: ModelSpec,
    call: sql.Composable,
    value: LiteralString,
    params: dict[str, Any],
    ef_search: int | None,
) -> list[tuple[str, float, str]]:
    """Run a helper and join each hit's text, in the helper's order, in one statement."""
    statement = sql.SQL(
        "SELECT h.key, h.{value}, t.{text} "
        "FROM {call} WITH ORDINALITY AS h(key, {value}, n) "
        "JOIN {table} t ON t.{key} = h.key::{type} ORDER BY h.n"
    ).format(
        value=sql.Identifier(value),
        text=sql.Identifier(spec.text_column),
        call=call,
        table=naming.table(spec),
        key=sql.Identifier(spec.key_column),
        type=naming.key_type(spec),
    )
    with errors(), conn.transaction():
        if ef_search is not None:
            # The helpers' override: wins over the model's default, even when it is pgvector's 40.
            conn.execute("SELECT set_config('pgembed.ef_search', %s, true)", (str(ef_search),))
        return conn.execute(statement, params).fetchall()


def _jsonb(filter: Filter | None) -> Jsonb | None:
    if filter is None:
        return None
    if not isinstance(filter, Mapping):
        raise UsageError("a filter must be a mapping of column -> value or {'$op': value}")
    return Jsonb(dict(filter))


def parse_filter(text: str | None) -> dict[str, Any] | None:
    """A --filter option: a JSON object, or a usage error that fits on one line."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--filter is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError('--filter must be a JSON object, e.g. \'{"rating": {"$gte": 4}}\'')
    return value


@contextmanager
def errors() -> Iterator[None]:
    """The helpers' errors as pgembed errors: bad input is a usage error, a missing row NotFound."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from None


def translate(exc: psycopg.Error) -> PgembedError:
    state = exc.sqlstate or ""
    message = db.first_line(exc)
    if state.startswith("22"):  # data exceptions: a bad filter, k, vector or value
        return UsageError(message)
    if state in ("P0002", "42704", "55000"):  # no such row / model / full-text index
        return NotFoundError(message)
    return db.describe(exc)


def _require_vectors(conn: psycopg.Connection, spec: ModelSpec) -> None:
    row = conn.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {} IS NOT NULL)").format(
            naming.table(spec), sql.Identifier(spec.embedding_column)
        )
    ).fetchone()
    if not row or not row[0]:
        raise NotFoundError(f"model {spec.name!r} has no vectors yet: run `pgembed sync`")


@dataclass(frozen=True)
class Request:
    """What `pgembed query` asks for: TEXT or --similar-to KEY, plain or --hybrid."""

    text: str | None
    k: int = 10
    filter: dict[str, Any] | None = None
    similar_to: str | None = None
    hybrid: bool = False
    ef_search: int | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.similar_to is None):
            raise UsageError("give either TEXT or --similar-to KEY")
        if self.hybrid and self.text is None:
            raise UsageError("--hybrid needs TEXT (it ranks the text's words too)")


def run(conn: psycopg.Connection, spec: ModelSpec, request: Request) -> list[Hit] | list[HybridHit]:
    options: dict[str, Any] = {"ef_search": request.ef_search}
    if request.similar_to is not None:
        return similar(conn, spec, request.similar_to, request.k, request.filter, **options)
    assert request.text is not None  # Request checks it
    if request.hybrid:
        return hybrid(conn, spec, request.text, request.k, request.filter, **options)
    return query(conn, spec, request.text, request.k, request.filter, **options)
