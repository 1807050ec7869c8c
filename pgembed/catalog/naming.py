"""Validation of the identifiers users give us (model, table, column names)."""

from __future__ import annotations

import re

from pgembed.errors import UsageError

_MODEL_RE = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")


def model_name(name: str) -> str:
    """A model name becomes part of a column name (`embedding_<name>`), so it is kept plain."""
    if not _MODEL_RE.match(name):
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
    if not _IDENT_RE.match(name):
        raise UsageError(
            f"invalid {kind} name {name!r}: use letters, digits, '_' or '$' (at most 63), "
            "starting with a letter or '_'"
        )
    return name


def table(name: str) -> tuple[str, str]:
    """`table` or `schema.table` -> (schema, table); the schema defaults to public."""
    schema, dot, rest = name.partition(".")
    if not dot:
        return "public", identifier("table", name)
    return identifier("schema", schema), identifier("table", rest)


def embedding_column(model: str) -> str:
    return f"embedding_{model}"
