"""Vector write-back: a vector lands only if the row still has the text that was embedded."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import psycopg
from pgvector import Vector
from psycopg import sql

from pgembed.catalog.registry import ModelSpec
from pgembed.sync import source


def write(
    conn: psycopg.Connection,
    spec: ModelSpec,
    keys: Sequence[str],
    text_md5s: Sequence[str],
    vectors: np.ndarray,
) -> set[str]:
    """Write vectors where md5(text) still matches; returns the keys actually written.

    Sorted keys keep lock order stable between concurrent writers. Vectors travel in binary.
    """
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    query = sql.SQL(
        "UPDATE {table} t SET {column} = v.embedding "
        "FROM unnest(%s::text[], %s::text[], %b::vector[]) AS v(key, text_md5, embedding) "
        "WHERE t.{key} = v.key::{type} AND md5(t.{text}) = v.text_md5 "
        "RETURNING v.key"
    ).format(
        table=source.table(spec),
        column=sql.Identifier(spec.embedding_column),
        key=sql.Identifier(spec.key_column),
        text=sql.Identifier(spec.text_column),
        type=source.key_type(spec),
    )
    params = (
        [keys[i] for i in order],
        [text_md5s[i] for i in order],
        [Vector(vectors[i]) for i in order],
    )
    with conn.cursor(binary=True) as cur:
        return {row[0] for row in cur.execute(query, params)}
