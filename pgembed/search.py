"""Query text -> nearest rows: embedded with exactly the model's settings, found through HNSW."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from pgvector import Vector
from psycopg import sql

from . import catalog, embedder, models, source
from .catalog import ModelSpec
from .embedder import Vectors
from .errors import NotFoundError


@dataclass(frozen=True)
class Hit:
    key: str
    similarity: float
    text: str


def embed_query(spec: ModelSpec, text: str) -> Vectors:
    return embedder.get(models.settings_of(spec)).encode_queries([text]).reshape(-1)


def nearest(conn: psycopg.Connection, spec: ModelSpec, vector: Vectors, k: int) -> list[Hit]:
    """The k rows nearest to `vector` by cosine distance; `ORDER BY col <=> q LIMIT k` uses HNSW."""
    query = nearest_sql(spec)
    with conn.transaction():
        if spec.ef_search:
            conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(spec.ef_search),))
        rows = conn.execute(query, {"q": Vector(vector), "k": k}).fetchall()
    if not rows:
        _require_vectors(conn, spec)
    return [Hit(key, float(similarity), text) for key, similarity, text in rows]


def nearest_sql(spec: ModelSpec) -> sql.Composed:
    """Parameters: %(q)b the query vector, %(k)s the number of rows."""
    column = sql.Identifier(spec.embedding_column)
    return sql.SQL(
        "SELECT t.{key}::text, 1 - (t.{column} <=> %(q)b), t.{text} FROM {table} t "
        "WHERE t.{column} IS NOT NULL ORDER BY t.{column} <=> %(q)b LIMIT %(k)s"
    ).format(
        key=sql.Identifier(spec.key_column),
        column=column,
        text=sql.Identifier(spec.text_column),
        table=source.table(spec),
    )


def query(conn: psycopg.Connection, spec: ModelSpec, text: str, k: int = 10) -> list[Hit]:
    """Embed `text` with the model's settings and search.

    If a reindex switched the model between reading `spec` and searching, the query vector was
    made for the previous version: search again with the current one, so a query never meets
    the other version's vectors.
    """
    while True:
        try:
            hits = nearest(conn, spec, embed_query(spec, text), k)
        except psycopg.errors.DataException:  # e.g. other dimensions since the switch
            current = catalog.get(conn, spec.name)
            if catalog.same_space(current, spec):
                raise
        else:
            current = catalog.get(conn, spec.name)
            if catalog.same_space(current, spec):
                return hits
        spec = current


def _require_vectors(conn: psycopg.Connection, spec: ModelSpec) -> None:
    row = conn.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE {} IS NOT NULL)").format(
            source.table(spec), sql.Identifier(spec.embedding_column)
        )
    ).fetchone()
    if not row or not row[0]:
        raise NotFoundError(f"model {spec.name!r} has no vectors yet: run `pgembed sync`")
