"""Names: validation of the identifiers users give (model, table, column), and every name
pgembed derives from a model (column, indexes, triggers, shadow, NOTIFY channel)."""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

from psycopg import sql

from pgembed.errors import UsageError

if TYPE_CHECKING:
    from pgembed.catalog.registry import ModelSpec

# Matched with fullmatch: `$` would also match before a final newline ("abc\n").
_MODEL_RE = re.compile(r"[a-z][a-z0-9_]{0,47}")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")


def model_name(name: str) -> str:
    """A model name becomes part of a column name (`embedding_<name>`), so it is kept plain."""
    if not _MODEL_RE.fullmatch(name):
        raise UsageError(
            f"invalid model name {name!r}: use 1-48 lowercase letters, digits or '_', "
            "starting with a letter"
        )
    if "__" in name:
        raise UsageError(
            f"invalid model name {name!r}: '__' is reserved for pgembed's reindex shadows"
        )
    return name


def identifier(kind: str, name: str) -> str:
    """A table or column name: letters, digits, '_' and '$', at most 63 characters."""
    if not _IDENT_RE.fullmatch(name):
        raise UsageError(
            f"invalid {kind} name {name!r}: use letters, digits, '_' or '$' (at most 63), "
            "starting with a letter or '_'"
        )
    return name


def parse_table(name: str) -> tuple[str, str]:
    """`table` or `schema.table` -> (schema, table); the schema defaults to public."""
    schema, dot, rest = name.partition(".")
    if not dot:
        return "public", identifier("table", name)
    return identifier("schema", schema), identifier("table", rest)


def embedding_column(model: str) -> str:
    return f"embedding_{model}"


# Names pgembed derives from a model. The SQL side spells some of them too (the capture triggers
# NOTIFY on CHANNEL; the hybrid helper looks for fulltext_index_name): change both together.
CHANNEL = "pgembed"  # the LISTEN/NOTIFY channel; the payload is the model's name
SHADOW_SUFFIX = "__next"  # a reindex's shadow model; user names cannot contain '__'
_TRIGGER_EVENTS = ("ins", "upd", "del", "trunc", "vec")  # vec: 20_capture.sql spells it too


def index_name(spec: ModelSpec) -> str:
    return f"pgembed_{spec.name}_hnsw"


def rebuild_index_name(spec: ModelSpec) -> str:
    """Where `reindex --index-only` builds the new index (fits in 63 bytes for any model name)."""
    return f"pgembed_{spec.name}_next"


def fulltext_index_name(spec: ModelSpec) -> str:
    return f"pgembed_{spec.name}_fts"


def chunk_table_name(spec: ModelSpec) -> str:
    """A chunked model's windows past the first, beside its table (at most 63 bytes). The SQL
    side (pgembed._semantic_v1) spells it too."""
    return f"pgembed_{spec.name}_chunks"


def chunk_index_name(spec: ModelSpec) -> str:
    return f"pgembed_{spec.name}_hnswc"


def chunk_key_name(spec: ModelSpec) -> str:
    """The chunk table's primary key (its default name, <table>_pkey, could pass 63 bytes)."""
    return f"pgembed_{spec.name}_ckey"


def chunk_table(spec: ModelSpec) -> sql.Identifier:
    return sql.Identifier(spec.table_schema, chunk_table_name(spec))


def trigger_names(spec: ModelSpec) -> list[str]:
    return [f"pgembed_{spec.name}_{event}" for event in _TRIGGER_EVENTS]


def shadow_name(name: str) -> str:
    """`NAME__next`, shortened with a hash to fit 48 characters."""
    if len(name) + len(SHADOW_SUFFIX) <= 48:
        return name + SHADOW_SUFFIX
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: 48 - len(SHADOW_SUFFIX) - 9]}_{digest}{SHADOW_SUFFIX}"


def text_expression(spec: ModelSpec, alias: str | None = None) -> sql.Composable:
    """The text the model embeds, over the table's columns (as `alias.column` when given): the
    column itself, or several joined by a newline with a NULL one as empty. The SQL side's
    pgembed._text_v1 writes the same, so a full-text index on it is matched by hybrid search."""

    def column(name: str) -> sql.Identifier:
        return sql.Identifier(alias, name) if alias else sql.Identifier(name)

    if len(spec.text_columns) == 1:
        return column(spec.text_columns[0])
    parts = [
        sql.SQL("coalesce({}::pg_catalog.text, '')").format(column(name))
        for name in spec.text_columns
    ]
    return sql.SQL("({})").format(sql.SQL(" || E'\\n' || ").join(parts))


def table(spec: ModelSpec) -> sql.Identifier:
    """The watched table, quoted."""
    return sql.Identifier(spec.table_schema, spec.table_name)


def only(spec: ModelSpec) -> sql.Composed:
    """The watched table without its inheritance children, as searches read it: a child's rows
    are not the model's (its triggers never see their writes; a child makes the model broken)."""
    return sql.SQL("ONLY {}").format(table(spec))


# format_type() output of the key column, e.g. "integer", "character varying(20)", "uuid".
_KEY_TYPE_RE = re.compile(r"[a-z][a-z0-9_ ]*(\(\d+(,\d+)?\))?(\[\])?")


def key_type(spec: ModelSpec) -> sql.Composable:
    """The type queue keys (stored as text) are cast back to, so the key index is used.

    The server's pgembed._key_v1 names it, schema-qualified, with the model; a spec made without
    it (never read from the catalog) falls back to key_type, checked to be a plain name."""
    if spec.key_cast is not None:
        return sql.SQL(spec.key_cast)  # type: ignore[arg-type,unused-ignore]
    if not _KEY_TYPE_RE.fullmatch(spec.key_type):
        raise UsageError(f"unsupported key column type {spec.key_type!r}")
    return sql.SQL(spec.key_type)  # type: ignore[arg-type,unused-ignore]


def key_at(spec: ModelSpec, alias: str, column: str | None = None) -> sql.Composable:
    """The key column (`column`: a chunk table's `key`) of the table under `alias`, as every
    statement compares it: cast to the key's base type, so that a domain's own `=` (anyone who
    may CREATE in its schema could add one) is never looked up (pgembed._key_v1). A spec read
    without _key_v1 keeps the column as it is."""
    name = sql.SQL("{}.{}").format(sql.Identifier(alias), sql.Identifier(column or spec.key_column))
    return sql.SQL("({})::{}").format(name, key_type(spec)) if spec.key_cast else name


def key_equals(spec: ModelSpec) -> sql.Composable:
    """The `=` between the key column and a key_type value, schema-qualified: an extension's type
    (citext) is compared by its own, which its index answers, not text's (pgembed._key_v1)."""
    return sql.SQL(spec.key_equals or "OPERATOR(pg_catalog.=)")  # type: ignore[arg-type,unused-ignore]


def key_is(
    spec: ModelSpec, alias: str, other: sql.Composable, column: str | None = None
) -> sql.Composable:
    """`alias`'s key (key_at) compared to `other` (a key_type value, or ANY of an array of
    them) by key_equals: the one way every statement matches a key."""
    return sql.SQL("{} {} {}").format(key_at(spec, alias, column), key_equals(spec), other)


def key_in(spec: ModelSpec, alias: str, column: str | None = None) -> sql.Composable:
    """key_is ANY of the statement's array parameter of keys (text, cast to key_type)."""
    return key_is(spec, alias, sql.SQL("ANY(%s::{}[])").format(key_type(spec)), column)


def key_greater(spec: ModelSpec) -> sql.Composable:
    """The `>` of the same (a backfill's pages walk the key's index in its order)."""
    return sql.SQL(spec.key_greater or "OPERATOR(pg_catalog.>)")  # type: ignore[arg-type,unused-ignore]
