"""The model registry (`pgembed.models`): what each embedding space is and where it lives."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import psycopg
from psycopg.rows import dict_row

from .errors import NotFoundError

POOLINGS = ("mean", "cls", "max")


@dataclass(frozen=True)
class ModelSpec:
    """One embedding space. Change any setting that affects vectors and it is a new space."""

    name: str
    table_schema: str
    table_name: str
    key_column: str
    key_type: str
    text_column: str
    embedding_column: str
    model_ref: str
    pooling: str
    normalize: bool
    dimensions: int
    max_seq_length: int
    model_revision: str | None = None
    query_prefix: str = ""
    document_prefix: str = ""
    hnsw_m: int = 16
    hnsw_ef_construction: int = 64
    ef_search: int | None = None
    status: str = "active"
    precision: str = "fp32"  # what every encoder of this model computes in (see precision.py)
    precision_requested: str = "fp32"
    precision_cosine: float | None = None  # agreement with fp32 vectors when it was checked
    precision_note: str = ""

    @property
    def qualified_table(self) -> str:
        return f"{self.table_schema}.{self.table_name}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_COLUMNS = [f.name for f in fields(ModelSpec)]
_SELECT = f"SELECT {', '.join(_COLUMNS)} FROM pgembed.models"


def _spec(row: dict[str, Any]) -> ModelSpec:
    return ModelSpec(**row)


def get(conn: psycopg.Connection, name: str) -> ModelSpec:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(_SELECT + " WHERE name = %s", (name,)).fetchone()
    if row is None:
        raise NotFoundError(f"unknown model {name!r}: see `pgembed model list`")
    return _spec(row)


def all_models(conn: psycopg.Connection) -> list[ModelSpec]:
    with conn.cursor(row_factory=dict_row) as cur:
        return [_spec(row) for row in cur.execute(_SELECT + " ORDER BY name")]


def exists(conn: psycopg.Connection, name: str) -> bool:
    row = conn.execute("SELECT EXISTS (SELECT 1 FROM pgembed.models WHERE name = %s)", (name,))
    result = row.fetchone()
    return bool(result and result[0])


def insert(conn: psycopg.Connection, spec: ModelSpec) -> None:
    values = spec.as_dict()
    placeholders = ", ".join(f"%({c})s" for c in _COLUMNS)
    conn.execute(
        f"INSERT INTO pgembed.models ({', '.join(_COLUMNS)}) VALUES ({placeholders})", values
    )


def delete(conn: psycopg.Connection, name: str) -> None:
    conn.execute("DELETE FROM pgembed.models WHERE name = %s", (name,))


def set_precision(
    conn: psycopg.Connection,
    name: str,
    precision: str,
    requested: str,
    cosine: float | None,
    note: str,
) -> None:
    conn.execute(
        "UPDATE pgembed.models SET precision = %s, precision_requested = %s, "
        "precision_cosine = %s, precision_note = %s WHERE name = %s",
        (precision, requested, cosine, note, name),
    )
