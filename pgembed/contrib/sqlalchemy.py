"""SQLAlchemy 2.0: search a mapped table by its pgembed column; keep Alembic off pgembed's objects.

Map the watched table as usual and add the model's column with pgvector's type, e.g.
`embedding_minilm: Mapped[Any] = mapped_column(Vector(384), deferred=True)`. `nearest` and
`similar_to` are one `ORDER BY embedding_minilm <=> q LIMIT k` statement each, so the HNSW index
is used, with the caller's `where` in the same statement.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

try:
    import sqlalchemy as sa
    from pgvector.sqlalchemy import VECTOR
    from sqlalchemy.orm import Session
except ImportError as exc:  # an optional extra: say how to get it
    raise ImportError(
        f"pgembed.contrib.sqlalchemy needs SQLAlchemy ({exc}): pip install 'pgembed[sqlalchemy]'"
    ) from None

from pgembed.catalog import naming
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import NotFoundError, UsageError
from pgembed.search import vectors

T = TypeVar("T")
SCHEMA = "pgembed"


def nearest(
    session: Session,
    entity: type[T],
    model: str,
    text: str,
    k: int = 10,
    where: sa.ColumnElement[bool] | None = None,
) -> list[tuple[T, float]]:
    """The k instances whose text is nearest to `text`, with their cosine similarity."""
    spec = model_spec(session, model)
    column = _column(entity, spec, spec.embedding_column)
    return _run(session, entity, spec, column, vectors.embed_query(spec, text), k, [where])


def similar_to(
    session: Session,
    entity: type[T],
    model: str,
    key: Any,
    k: int = 10,
    where: sa.ColumnElement[bool] | None = None,
) -> list[tuple[T, float]]:
    """The k instances nearest to the row with this key (itself excluded), with their similarity."""
    spec = model_spec(session, model)
    column = _column(entity, spec, spec.embedding_column)
    key_column = _column(entity, spec, spec.key_column)
    target = column.table.alias("pgembed_target")  # an alias: the subquery must not correlate
    vector = (
        sa.select(target.c[column.key]).where(target.c[key_column.key] == key).scalar_subquery()
    )
    # `vector IS NOT NULL` is a one-time filter: a missing row yields no rows, not NULL distances.
    conditions = [key_column != key, vector.is_not(None), where]
    hits = _run(session, entity, spec, column, vector, k, conditions)
    if not hits:
        _require_vector(session, column, key_column, key, spec)
    return hits


neighbours = similar_to


def model_spec(session: Session, model: str) -> ModelSpec:
    row = (
        session.execute(sa.text("SELECT * FROM pgembed.models WHERE name = :name"), {"name": model})
        .mappings()
        .first()
    )
    if row is None:
        raise NotFoundError(f"unknown model {model!r}: see `pgembed model list`")
    return ModelSpec(**{f.name: row[f.name] for f in fields(ModelSpec)})


def _run(
    session: Session,
    entity: type[T],
    spec: ModelSpec,
    column: sa.Column[Any],
    query: Any,
    k: int,
    conditions: list[sa.ColumnElement[bool] | None],
) -> list[tuple[T, float]]:
    if k < 1:
        raise UsageError(f"k must be a positive number of rows, not {k}")
    # The model's ef_search and iterative index scans (so a `where` still yields k rows), SET
    # LOCAL for the session's transaction unless the caller set them.
    session.execute(sa.text("SELECT pgembed._apply_settings_v1(:model)"), {"model": spec.name})
    where = [column.is_not(None), *(c for c in conditions if c is not None)]
    if spec.chunked:
        hits = _best_windows(session, entity, spec, column, query, k, where)
    else:
        distance = _vector(column, spec).cosine_distance(query)
        statement = (
            sa.select(entity, (1 - distance).label("similarity"))
            .where(*where)
            .order_by(distance)
            .limit(k)
        )
        hits = [(row[0], float(row[1])) for row in session.execute(statement)]
    # Relaxed iterative scans may return near-ties slightly out of order.
    return sorted(hits, key=lambda hit: -hit[1])


def _best_windows(
    session: Session,
    entity: type[T],
    spec: ModelSpec,
    column: sa.Column[Any],
    query: Any,
    k: int,
    where: list[sa.ColumnElement[bool]],
) -> list[tuple[T, float]]:
    """A chunked model: rows ranked by their best window, as pgembed.search ranks them (see
    pgembed._semantic_v1). The k nearest rows by their own vector and the depth·k nearest
    chunks (of rows the `where` keeps), each one `ORDER BY <=> LIMIT` that can take its HNSW
    index, merged by row; read deeper until no unread chunk could change the rows."""
    depth = 4
    while True:
        rows = session.execute(_windows_statement(entity, spec, column, query, k, where, depth))
        found = [(row[0], float(row[1]), row[2]) for row in rows]
        if all(settled for _, _, settled in found) or depth >= 4096:
            return [(instance, similarity) for instance, similarity, _ in found]
        depth *= 4


def _windows_statement(
    entity: type[T],
    spec: ModelSpec,
    column: sa.Column[Any],
    query: Any,
    k: int,
    where: list[sa.ColumnElement[bool]],
    depth: int,
) -> sa.Select[Any]:
    chunks = sa.table(
        naming.chunk_table_name(spec),
        sa.column("key"),
        sa.column("embedding"),
        schema=spec.table_schema,
    )
    key = _column(entity, spec, spec.key_column)
    own = _vector(column, spec).cosine_distance(query)
    piece = _vector(chunks.c.embedding, spec).cosine_distance(query)
    rows = sa.select(key.label("key"), own.label("distance")).where(*where)
    pieces = (
        sa.select(key.label("key"), piece.label("distance"))
        .select_from(chunks.join(column.table, key == chunks.c.key))
        .where(*where)
        .order_by(piece)
        .limit(depth * k)
        .cte("pgembed_pieces")
    )
    merged = sa.union_all(
        sa.select(rows.order_by(own).limit(k).subquery()),
        sa.select(pieces.c.key, pieces.c.distance),
    ).subquery()
    distance = sa.func.min(merged.c.distance)
    best = (
        sa.select(merged.c.key, distance.label("distance"))
        .group_by(merged.c.key)
        .order_by(distance)
        .limit(k)
        .cte("pgembed_best")
    )
    count, farthest = sa.func.count(), sa.func.max
    settled = sa.or_(
        sa.select(count).select_from(pieces).scalar_subquery() < depth * k,
        sa.and_(
            sa.select(count).select_from(best).scalar_subquery() >= k,
            sa.select(farthest(pieces.c.distance)).scalar_subquery()
            >= sa.select(farthest(best.c.distance)).scalar_subquery(),
        ),
    )
    return (
        sa.select(entity, (1 - best.c.distance).label("similarity"), settled.label("settled"))
        .join(best, key == best.c.key)
        .order_by(best.c.distance)
    )


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


def _vector(column: sa.ColumnElement[Any], spec: ModelSpec) -> Any:
    """The column with pgvector's comparator (`cosine_distance`), whatever type it was mapped as."""
    return sa.type_coerce(column, VECTOR(spec.dimensions))


def _require_vector(
    session: Session, column: sa.Column[Any], key_column: sa.Column[Any], key: Any, spec: ModelSpec
) -> None:
    found = session.execute(sa.select(column).where(key_column == key)).first()
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

    `context.configure(..., include_object=pgembed.orm.include_object)` in env.py. Alembic does
    not compare triggers, so pgembed's capture triggers need nothing.
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
