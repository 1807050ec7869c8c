"""2,500 real IMDb reviews' vectors made by the real model (tests/data/imdb-vectors.npz) in a
`reviews` table, its 30 held-out reviews as queries, and searches of it against an exact scan.
The session's table is tests/integration/conftest.py's `real_url`.

`reviews` (id, rating 1-10, cat 0-999, body, sentiment 'pos'/'neg'): `rating >= 8` matches 30 %
of the rows and has no index; `cat` has a B-tree index, `cat < 10` matches 1 %, `cat = 7` 0.1 %
(2 rows, fewer than k).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector import Vector
from psycopg.types.json import Jsonb

from pgembed.catalog import ddl
from pgembed.lifecycle import models

DATA = Path(__file__).parent / "data" / "imdb-vectors.npz"
K = 10


def unit(stored: np.ndarray) -> np.ndarray:
    vectors = stored.astype(np.float32)
    found: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return found


def queries() -> list[Vector]:
    """The 30 held-out reviews' vectors."""
    return [Vector(v) for v in unit(np.load(DATA)["queries"])]


def make_reviews(conn: psycopg.Connection) -> None:
    """The 2,500 reviews' vectors in `reviews`, model `minilm`, its HNSW index, ANALYZEd."""
    documents = unit(np.load(DATA)["documents"])
    conn.execute(
        "CREATE TABLE reviews (id integer PRIMARY KEY, rating integer NOT NULL, "
        "cat integer NOT NULL, body text NOT NULL, "
        "sentiment text GENERATED ALWAYS AS (CASE WHEN rating >= 7 THEN 'pos' "
        "ELSE 'neg' END) STORED)"
    )
    request = models.AddRequest("minilm", "reviews", "body", precision="fp32", index=False)
    spec = models.add(conn, request)[0]
    # The vectors are there already: the capture triggers would queue every row.
    conn.execute("ALTER TABLE reviews DISABLE TRIGGER USER")
    copy = "COPY reviews (id, rating, cat, body, embedding_minilm) FROM STDIN (FORMAT BINARY)"
    with conn.cursor() as cur, cur.copy(copy) as out:
        out.set_types(["integer", "integer", "integer", "text", "vector"])
        for i, vector in enumerate(documents):
            cat = i * 7919 % 1000
            out.write_row((i, cat % 10 + 1, cat, f"review {i}", Vector(vector)))
    conn.execute("ALTER TABLE reviews ENABLE TRIGGER USER")
    conn.execute("CREATE INDEX reviews_cat ON reviews (cat)")
    ddl.create_index(conn, spec)
    ddl.create_fulltext_index(conn, spec)
    conn.execute("ANALYZE reviews")


def exact(conn: psycopg.Connection, q: Vector, where: str = "true", k: int = K) -> list[int]:
    """The true k nearest matching rows: every row read (no index can order them)."""
    with conn.transaction():
        conn.execute("SET LOCAL enable_indexscan = off")
        found = conn.execute(
            f"SELECT id FROM reviews WHERE {where} "  # where: a constant of a test
            "ORDER BY embedding_minilm <=> %s, id LIMIT %s",
            (q, k),
        ).fetchall()
    return [row[0] for row in found]


def search(
    conn: psycopg.Connection, q: Vector, filter: dict[str, Any] | None, k: int = K
) -> list[tuple[int, float]]:
    found = conn.execute(
        "SELECT key::integer, similarity FROM pgembed.search('minilm', %s, %s, %s)",
        (q, k, Jsonb(filter) if filter is not None else None),
    ).fetchall()
    return [(key, value) for key, value in found]
