"""The model registry (`pgembed.models`): what each embedding space is and where it lives."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row

from pgembed import defaults, sqlfiles
from pgembed.errors import NotFoundError, UsageError

POOLINGS = ("mean", "cls", "max")  # the poolings a model may have (CLI choices, encoders)
# What happens to a text longer than the model's window: only its first window is embedded, or
# every window (the first in the model's column, the others in its chunk table).
LONG_TEXTS = ("truncate", "chunk")


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
    query_prefix: str = ""
    document_prefix: str = ""
    hnsw_m: int = 16
    # 200, not pgvector's 64: at 1M rows its graph reaches recall@10 0.95 at ef_search ~400 where
    # the sparser one needs ~1000 (2.5 times the latency); the build costs 2.4 times as long
    # (BENCHMARKS.md, "Search at scale").
    hnsw_ef_construction: int = 200
    ef_search: int | None = None  # by tune; its two walks (0018) are read by pgembed.search only
    version: int = 1
    shadow_of: str | None = None  # set on a reindex's shadow: the model it will replace
    precision: str = "fp32"  # what every encoder of this model computes in (see precision.py)
    precision_requested: str = "fp32"
    precision_cosine: float | None = None  # agreement with fp32 vectors when it was checked
    precision_note: str = ""
    # The columns embedded together, joined by a newline; the first is text_column.
    text_columns: tuple[str, ...] = ()
    long_texts: str = "truncate"  # or "chunk": see LONG_TEXTS
    # How statements compare the key column, so that its index answers (pgembed._key_v1): the
    # type a key's text is cast to and its `=` and `>`, schema-qualified. Read from the table
    # with the model, never stored; None where not read (naming falls back to key_type).
    key_cast: str | None = field(default=None, metadata={"derived": True})
    key_equals: str | None = field(default=None, metadata={"derived": True})
    key_greater: str | None = field(default=None, metadata={"derived": True})

    def __post_init__(self) -> None:
        if not self.text_columns:  # a one-column model, made without naming its columns
            object.__setattr__(self, "text_columns", (self.text_column,))

    @property
    def columns(self) -> list[str]:
        """Every column of its table the model reads or writes: key, text(s), vector."""
        return [self.key_column, *self.text_columns, self.embedding_column]

    @property
    def chunked(self) -> bool:
        return self.long_texts == "chunk"

    @property
    def windows(self) -> int:
        """The windows of a row's text it embeds at most: the first, or up to MAX_WINDOWS."""
        return defaults.MAX_WINDOWS if self.chunked else 1

    @property
    def qualified_table(self) -> str:
        return f"{self.table_schema}.{self.table_name}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_COLUMNS = [f.name for f in fields(ModelSpec) if not f.metadata.get("derived")]
_KEY = "pgembed._key_v1(m.table_schema, m.table_name, m.key_column)"
_SELECT = (
    f"SELECT {', '.join('m.' + c for c in _COLUMNS)}, k.cast_to AS key_cast, "
    f"k.equals AS key_equals, k.greater AS key_greater FROM pgembed.models m, {_KEY} k"
)
# The one read of the catalog's rows, as dict rows that `from_row` (or `found`) turns into
# specs; the search planner, `pgembed serve` and the SQLAlchemy integration run them on their
# own connections. BY_NAME: one model (parameter: its name); ALL: every model, by name.
BY_NAME = _SELECT + " WHERE m.name = %s"
ALL = _SELECT + " ORDER BY m.name"
# The names a user may mean when BY_NAME found nothing (a reindex's shadow is no model of theirs).
NAMES = "SELECT name FROM pgembed.models WHERE shadow_of IS NULL ORDER BY name"


def keyed(conn: psycopg.Connection, spec: ModelSpec) -> ModelSpec:
    """`spec` with how its key column compares now (pgembed._key_v1): for a spec made in Python
    (`model add`), or after its key column's type changed (alter-table)."""
    row = conn.execute(
        "SELECT * FROM pgembed._key_v1(%s, %s, %s)",
        (spec.table_schema, spec.table_name, spec.key_column),
    ).fetchone()
    cast_to, equals, greater = row if row else (None, None, None)
    return replace(spec, key_cast=cast_to, key_equals=equals, key_greater=greater)


def from_row(row: Mapping[str, Any]) -> ModelSpec:
    """The spec of one of BY_NAME's or ALL's rows."""
    return ModelSpec(**{**row, "text_columns": tuple(row["text_columns"])})


def found(name: str, row: Mapping[str, Any] | None, names: Iterable[str] = ()) -> ModelSpec:
    """The spec of BY_NAME's row, or the error that says the model does not exist (with the
    catalog's `names`, NAMES' rows, it suggests the ones `name` may be a typo of)."""
    if row is None:
        raise unknown(name, names)
    return from_row(row)


def unknown(
    name: str, names: Iterable[str], known: str = "see `pgembed model list`"
) -> NotFoundError:
    """The error for a model name that is not one of `names`: "did you mean" the close ones
    (difflib, ignoring case), then `known`, where to find the names."""
    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(str(name).lower(), list(by_lower), n=3, cutoff=0.6)
    if not close:
        return NotFoundError(f"unknown model {name!r}: {known}")
    options = " or ".join(repr(by_lower[c]) for c in close)
    return NotFoundError(f"unknown model {name!r}: did you mean {options}? ({known})")


def names(conn: psycopg.Connection) -> list[str]:
    """The models' names (NAMES): what a mistyped name is compared with."""
    return [row[0] for row in conn.execute(NAMES)]


def get(conn: psycopg.Connection, name: str) -> ModelSpec:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(BY_NAME, (name,)).fetchone()
    return found(name, row, names(conn) if row is None else ())


def all_models(conn: psycopg.Connection) -> list[ModelSpec]:
    with conn.cursor(row_factory=dict_row) as cur:
        return [from_row(row) for row in cur.execute(ALL)]


def locked(conn: psycopg.Connection, name: str) -> ModelSpec | None:
    """The model's row, share-locked until the caller's transaction ends (None if it is gone).

    A reindex switch takes these rows FOR UPDATE before it touches the table, so a writer that
    holds this lock knows the model's column cannot change under it until it commits.
    """
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(_SELECT + " WHERE m.name = %s FOR SHARE OF m", (name,)).fetchone()
    return None if row is None else from_row(row)


def shadow(conn: psycopg.Connection, name: str) -> ModelSpec | None:
    """The shadow of a reindex of `name` in progress, if any."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(_SELECT + " WHERE m.shadow_of = %s", (name,)).fetchone()
    return None if row is None else from_row(row)


def same_space(a: ModelSpec, b: ModelSpec) -> bool:
    """Whether vectors made for `a` may still be written where `b` keeps its vectors."""
    vector_fields = (
        "embedding_column",
        "model_ref",
        "pooling",
        "normalize",
        "dimensions",
        "max_seq_length",
        "document_prefix",
        "precision",
        "precision_requested",  # on a GPU, `auto` means its 16-bit type (precision.on_device)
        "version",
        "long_texts",
    )
    return all(getattr(a, f) == getattr(b, f) for f in vector_fields)


def exists(conn: psycopg.Connection, name: str) -> bool:
    result = conn.execute(sqlfiles.get("catalog", "model_exists"), {"name": name}).fetchone()
    return bool(result and result[0])


def insert(conn: psycopg.Connection, spec: ModelSpec) -> None:
    values = {**spec.as_dict(), "text_columns": list(spec.text_columns)}
    placeholders = ", ".join(f"%({c})s" for c in _COLUMNS)
    try:
        conn.execute(
            f"INSERT INTO pgembed.models ({', '.join(_COLUMNS)}) VALUES ({placeholders})", values
        )
    except psycopg.errors.UniqueViolation as exc:  # a concurrent `model add` of the name first
        if exc.diag.constraint_name != "models_pkey":
            raise
        raise UsageError(f"model {spec.name!r} already exists: see `pgembed model list`") from None


def record_version(conn: psycopg.Connection, spec: ModelSpec, name: str, active: bool) -> None:
    """Keep `spec`'s settings as version `spec.version` of model `name`.

    A version left by an abandoned reindex is overwritten by the next attempt at that number.
    """
    params = {"version_of": name, "active": active, "name": spec.name}
    conn.execute(sqlfiles.get("catalog", "record_version"), params)


def delete(conn: psycopg.Connection, name: str) -> None:
    conn.execute(sqlfiles.get("catalog", "delete_model"), {"name": name})


def set_precision(conn: psycopg.Connection, spec: ModelSpec) -> bool:
    """Store `spec`'s precision fields if the model is still at `spec.version` (checked against
    those settings); False if it was switched to another version meanwhile."""
    cur = conn.execute(sqlfiles.get("catalog", "set_precision"), spec.as_dict())
    return cur.rowcount == 1


# The columns of a model's table that the current role may read, in table order, except its
# vector columns (the model's embeddings; pgvector's types): what `pgembed serve` shows beside
# a hit (its "row" field). Parameter: the table, schema-qualified and quoted.
ROW_COLUMNS: LiteralString = """
SELECT a.attname
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid
WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(%s::text)
  AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
  AND t.typname::text NOT IN ('vector', 'halfvec', 'sparsevec')
  AND pg_catalog.has_column_privilege(a.attrelid, a.attnum, 'SELECT')
ORDER BY a.attnum
"""
