"""Reading the watched table: the text of queued keys, with a hash that guards the write-back."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgembed.catalog.registry import ModelSpec
from pgembed.errors import UsageError

# format_type() output of the key column, e.g. "integer", "character varying(20)", "uuid".
_KEY_TYPE_RE = re.compile(r"^[a-z][a-z0-9_ ]*(\(\d+(,\d+)?\))?(\[\])?$")


@dataclass(frozen=True)
class SourceRow:
    key: str
    text: str
    text_md5: str


def key_type(spec: ModelSpec) -> sql.Composable:
    """The key column's type, to cast queue keys (stored as text) back so the key index is used.

    It comes from the server's format_type(), not from a user; it is still checked to be plain.
    """
    if not _KEY_TYPE_RE.match(spec.key_type):
        raise UsageError(f"unsupported key column type {spec.key_type!r}")
    return sql.SQL(spec.key_type)  # type: ignore[arg-type,unused-ignore]


def table(spec: ModelSpec) -> sql.Identifier:
    return sql.Identifier(spec.table_schema, spec.table_name)


def read(conn: psycopg.Connection, spec: ModelSpec, keys: Sequence[str]) -> list[SourceRow]:
    """Rows that still exist and have non-blank text; other keys simply do not come back."""
    query = sql.SQL(
        "SELECT t.{key}::text, t.{text}, md5(t.{text}) "
        "FROM {table} t WHERE t.{key} = ANY(%s::{type}[]) AND btrim(t.{text}) <> ''"
    ).format(
        key=sql.Identifier(spec.key_column),
        text=sql.Identifier(spec.text_column),
        table=table(spec),
        type=key_type(spec),
    )
    return [SourceRow(*row) for row in conn.execute(query, (list(keys),))]
