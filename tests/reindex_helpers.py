"""The `docs` table the reindex tests (integration and acceptance) embed, and its checks."""

from __future__ import annotations

import numpy as np
import psycopg

from pgembed.encode import embedder

SUBJECTS = ["battery", "charger", "screen", "speaker", "keyboard", "camera", "headset", "parcel"]
VERDICTS = [
    "died after one week of light use",
    "works perfectly and I would buy it again",
    "is far too expensive for what you get",
    "feels cheap and rattles when you shake it",
    "exceeded every expectation I had",
]
TEXTS = {
    i + 1: f"The {s} {v}." for i, (s, v) in enumerate((s, v) for s in SUBJECTS for v in VERDICTS)
}


def make_table(conn: psycopg.Connection, texts: dict[int, str]) -> None:
    conn.execute("CREATE TABLE docs (id integer PRIMARY KEY, body text, stars integer)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO docs VALUES (%s, %s, 3)", list(texts.items()))


def encode(texts: list[str], **settings: object) -> np.ndarray:
    return embedder.get(embedder.Settings("all-MiniLM-L6-v2", **settings)).encode_documents(  # type: ignore[arg-type]
        texts
    )


def stored(conn: psycopg.Connection, column: str = "embedding_minilm") -> dict[int, np.ndarray]:
    rows = conn.execute(f"SELECT id, {column} FROM docs WHERE {column} IS NOT NULL").fetchall()
    return {key: vec.to_numpy() for key, vec in rows}


def assert_vectors(conn: psycopg.Connection, texts: dict[int, str], **settings: object) -> None:
    got = stored(conn)
    assert sorted(got) == sorted(texts)
    want = encode([texts[k] for k in sorted(texts)], **settings)
    np.testing.assert_allclose(np.stack([got[k] for k in sorted(texts)]), want, atol=1e-5)
