"""SQLAlchemy 2.0: search a mapped table by its pgembed model; keep Alembic off pgembed's objects.

Map the watched table as usual (its key column, and the model's vector column with pgvector's
type, e.g. `embedding_minilm: Mapped[Any] = mapped_column(Vector(384), deferred=True)`).
`nearest` and `similar_to` build the same `SearchRequest` as every other front end and run the
search planner (search/planner.py) on the session's own connection and transaction: the SQL helpers
pgembed.search / pgembed.similar rank the rows (the index, ef_search, iterative scans, a chunked
model's best window, `filter=`), then one statement loads the instances of the hits' keys, with
the caller's `where=`. A `where` is applied to the ranked hits: while fewer than k pass, the
helper is asked again for 4 times as many, until k pass or the index scan has no more (see
docs/python.md for what that costs; `filter=` costs nothing extra).
Needs SQLAlchemy's psycopg (3) driver: `postgresql+psycopg://...`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar, cast

try:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session
except ImportError as exc:  # an optional extra: say how to get it
    raise ImportError(
        f"pgembed.contrib.sqlalchemy needs SQLAlchemy ({exc}): pip install 'pgembed[sqlalchemy]'"
    ) from None

import psycopg

from pgembed import db
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import NotFoundError, UsageError
from pgembed.search import plan, planner
from pgembed.search.planner import Filter, Hit, SearchRequest

T = TypeVar("T")
S = TypeVar("S", bound="sa.Select[Any]")
SCHEMA = "pgembed"
# How much deeper each reading goes while a `where` leaves fewer than k of the hits.
DEEPER = 4


def nearest(
    session: Session,
    entity: type[T],
    model: str,
    text: str,
    k: int = 10,
    where: sa.ColumnElement[bool] | None = None,
    *,
    filter: Filter | None = None,
    ef_search: int | None = None,
) -> list[tuple[T, float]]:
    """The k instances whose text is nearest to `text`, with their cosine similarity, nearest
    first (pgembed.search). `filter`: the helpers' JSON filter ({"rating": {"$gte": 4}}), in
    the search itself; `where`: any SQLAlchemy condition on `entity`, applied to its hits."""
    request = SearchRequest(model, text=text, k=k, filter=filter, ef_search=ef_search)
    return _search(session, entity, request, where)


def similar_to(
    session: Session,
    entity: type[T],
    model: str,
    key: Any,
    k: int = 10,
    where: sa.ColumnElement[bool] | None = None,
    *,
    filter: Filter | None = None,
    ef_search: int | None = None,
) -> list[tuple[T, float]]:
    """The k instances nearest to the row with this key (itself excluded), with their similarity
    (pgembed.similar); `filter` and `where` as in `nearest`."""
    request = SearchRequest(model, similar_to=key, k=k, filter=filter, ef_search=ef_search)
    try:
        return _search(session, entity, request, where)
    except NotFoundError:
        spec = model_spec(session, model)
        _require_vector(session, entity, spec, key)  # the same error, with the key as given
        raise


neighbours = similar_to


def model_spec(session: Session, model: str) -> ModelSpec:
    """The model's catalog row (registry's one read), on the session's connection."""
    return plan.execute(_driver(session), planner.spec_plan(model))


def _search(
    session: Session,
    entity: type[T],
    request: SearchRequest,
    where: sa.ColumnElement[bool] | None,
) -> list[tuple[T, float]]:
    if session.autoflush:  # as a select would: the search sees the session's pending changes
        session.flush()
    conn = _driver(session)
    spec = plan.execute(conn, planner.spec_plan(request.model))
    _column(entity, spec, spec.embedding_column)  # the entity maps the model's table and vector
    key = _column(entity, spec, spec.key_column)
    asked = request.k
    while True:
        ranked = plan.execute(conn, planner.plan_for(spec, replace(request, k=asked)))
        hits = cast(list[Hit], ranked)  # never hybrid here
        found = _instances(session, entity, key, _key_matches(spec, key), hits, where)
        # k passed, or the helper has no more rows (fewer than asked: the table, or pgvector's
        # hnsw.max_scan_tuples for one scan, is exhausted): done.
        if len(found) >= request.k or len(hits) < asked or where is None:
            return found[: request.k]
        asked *= DEEPER


class _KeyType(sa.types.UserDefinedType[Any]):
    """The key's type as pgembed._key_v1 names it (schema-qualified), for a cast."""

    cache_ok = True

    def __init__(self, name: str) -> None:
        self.name = name

    def get_col_spec(self, **_: Any) -> str:
        return self.name


def _key_matches(
    spec: ModelSpec, key: sa.Column[Any]
) -> Callable[[sa.ColumnElement[Any]], sa.ColumnElement[bool]]:
    """How a hit's key is matched to the key column: both sides as the key's type, by
    its own `=` (pgembed._key_v1), which the key's index answers (a citext key compared as the
    VALUES' varchar read the whole table); the mapping's `==` for a spec read without it."""
    if spec.key_cast is None or spec.key_equals is None:
        return lambda value: key == value
    typ = _KeyType(spec.key_cast)
    equals = sa.cast(key, typ).op(spec.key_equals, is_comparison=True)
    return lambda value: equals(sa.cast(value, typ))


def _instances(
    session: Session,
    entity: type[T],
    key: sa.Column[Any],
    matches: Callable[[sa.ColumnElement[Any]], sa.ColumnElement[bool]],
    hits: list[Hit],
    where: sa.ColumnElement[bool] | None,
) -> list[tuple[T, float]]:
    """The hits' instances that pass `where`, in the hits' order. The keys travel as psycopg
    sent them (no type of the mapping's applies) and are matched by the server, so a mapped
    type that reads keys back in another Python form (a uuid as str) still finds them."""
    if not hits:
        return []
    ranked = sa.values(sa.column("key"), sa.column("n", sa.Integer), name="pgembed_hits").data(
        [(hit.key, n) for n, hit in enumerate(hits)]
    )
    statement = _only(
        sa.select(entity, ranked.c.n).join(ranked, matches(ranked.c.key)).order_by(ranked.c.n),
        key.table,
    )
    if where is not None:
        statement = statement.where(where)
    return [(instance, hits[n].similarity) for instance, n in session.execute(statement)]


def _driver(session: Session) -> psycopg.Connection:
    """The psycopg connection under the session's: searches run in its transaction, the helpers'
    statements in savepoints."""
    driver = session.connection().connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise UsageError(
            "pgembed's SQLAlchemy searches need the psycopg (3) driver: postgresql+psycopg://..."
        )
    if driver.adapters.types.get("vector") is None:  # once per connection: query vectors
        with plan.errors():
            db.register_vector(driver)
    return driver


def _column(entity: type[Any], spec: ModelSpec, name: str) -> sa.Column[Any]:
    table = sa.inspect(entity).local_table
    if not isinstance(table, sa.Table):
        raise UsageError(f"{entity.__name__} is not mapped to a table")
    if (table.schema or "public", table.name) != (spec.table_schema, spec.table_name):
        raise UsageError(
            f"{entity.__name__} maps {table.schema or 'public'}.{table.name}, but model "
            f"{spec.name} watches {spec.qualified_table}"
        )
    for column in table.columns:
        if column.name == name:
            return column  # type: ignore[no-any-return]
    raise UsageError(
        f"{entity.__name__} does not map column {name!r}"
        + (
            f": add it, e.g. mapped_column(Vector({spec.dimensions}), deferred=True)"
            if name == spec.embedding_column
            else ""
        )
    )


def _only(statement: S, table: Any) -> S:
    """`statement` reading the mapped table's own rows, as searches read it (naming.only): an
    inheritance child's rows are not the model's."""
    if isinstance(table, sa.Table):
        return statement.with_hint(table, "ONLY", "postgresql")
    return statement


def _require_vector(session: Session, entity: type[Any], spec: ModelSpec, key: Any) -> None:
    """Say which of the row or its vector is missing, naming the key as the caller gave it."""
    column = _column(entity, spec, spec.embedding_column)
    key_column = _column(entity, spec, spec.key_column)
    matches = _key_matches(spec, key_column)(sa.literal(key))  # the key type's =, as a search
    found = session.execute(_only(sa.select(column).where(matches), column.table)).first()
    if found is None:
        raise NotFoundError(f"{spec.qualified_table} has no row with {spec.key_column} = {key!r}")
    if found[0] is None:
        raise NotFoundError(
            f"row {spec.key_column} = {key!r} has no {spec.name} vector yet: run `pgembed sync`"
        )


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic: leave pgembed's tables (its schema's, and chunk tables), `embedding_*` columns and
    `pgembed_*` indexes alone.

    `context.configure(..., include_object=pgembed.contrib.sqlalchemy.include_object)` in
    env.py. Alembic does not compare triggers, so pgembed's capture triggers need nothing.
    """
    if type_ == "table":
        return getattr(obj, "schema", None) != SCHEMA and not _chunk_table(name)
    return _keep(name, type_)


def include_name(name: str | None, type_: str, parent_names: Mapping[str, str | None]) -> bool:
    """Alembic: don't even reflect the pgembed schema (with `include_schemas=True`)."""
    if type_ == "schema":
        return name != SCHEMA
    if type_ == "table":
        return parent_names.get("schema_name") != SCHEMA and not _chunk_table(name)
    return _keep(name, type_)


def _chunk_table(name: str | None) -> bool:
    """A chunked model's table of windows, beside the watched table (pgembed_<model>_chunks)."""
    return re.fullmatch(r"pgembed_[a-z0-9_]+_chunks", name or "") is not None


def _keep(name: str | None, type_: str) -> bool:
    if type_ == "column":
        return not (name or "").startswith("embedding_")
    if type_ == "index":
        return not (name or "").startswith("pgembed_")
    return True
