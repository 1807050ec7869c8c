"""Column types for `pgembed load`: inferred from every value of a column, or asked with --types.

Inference accepts only spellings that PostgreSQL reads the same way under any DateStyle, so a
COPY of the file's own text into the inferred type never fails or changes a value.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pgembed.catalog import naming
from pgembed.errors import UsageError

Value = str | int | float | bool | None  # a JSON scalar; nested JSON arrives as its text
Record = dict[str, Value]

TEXT = "text"
# `--types` names -> the column type (as format_type() spells it, which is also valid DDL).
TYPE_NAMES = {
    "text": TEXT,
    "int": "bigint",
    "bigint": "bigint",
    "float": "double precision",
    "double": "double precision",
    "bool": "boolean",
    "boolean": "boolean",
    "date": "date",
    "timestamp": "timestamp without time zone",
    "timestamptz": "timestamp with time zone",
}
_TEXT_TYPES = ("text", "character varying", "character", "citext")
# Each pair: a column with values of both kinds takes the second type (all values parse as it).
_WIDER = {
    ("bigint", "double precision"): "double precision",
    ("date", "timestamp without time zone"): "timestamp without time zone",
}
# Spellings PostgreSQL reads the same in every DateStyle; anything else stays text.
_INTEGER = re.compile(r"[+-]?(0|[1-9][0-9]*)")  # no leading zeros: "02134" is a code, not 2134
_FLOAT = re.compile(r"[+-]?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_TIMESTAMP = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?"
    r"(?P<zone>Z|[+-][0-9]{2}(:?[0-9]{2})?)?"
)
_DIGITS = re.compile(r"[+-]?[0-9]{1,18}")
_NUMBERS = ("bigint", "double precision")
_INT64 = 2**63


def parse_types(option: str | None) -> dict[str, str]:
    """`--types rating=int,score=float` -> {column: TYPE_NAMES name}."""
    types: dict[str, str] = {}
    for item in (option or "").split(","):
        if not item.strip():
            continue
        column, _, name = item.partition("=")
        if name.strip().lower() not in TYPE_NAMES:
            raise UsageError(
                f"--types {item.strip()!r}: write column=type, type one of "
                + ", ".join(sorted(TYPE_NAMES))
            )
        types[naming.identifier("column", column.strip())] = name.strip().lower()
    return types


def as_text(value: Value) -> str:
    """A value as text: JSON scalars as JSON writes them ("true", "7", "0.5")."""
    return value if isinstance(value, str) else json.dumps(value)


def type_of(value: Value, strings: bool = True) -> str | None:
    """The narrowest column type that reads `value`; None for no value (NULL or empty).

    strings=False (a JSON string): only dates and timestamps, which JSON writes as strings;
    a quoted "7" stays text.
    """
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "bigint" if -_INT64 <= value < _INT64 else TEXT
    if isinstance(value, float):
        return "double precision" if math.isfinite(value) else TEXT
    return _string_type(value) if strings else _temporal_type(value)


def _string_type(value: str) -> str:
    if _INTEGER.fullmatch(value):
        return "bigint" if -_INT64 <= int(value) < _INT64 else TEXT  # a long id: keep its digits
    if _FLOAT.fullmatch(value):
        return "double precision" if math.isfinite(float(value)) else TEXT
    if value.lower() in ("true", "false"):
        return "boolean"
    return _temporal_type(value)


def _temporal_type(value: str) -> str:
    try:
        if _DATE.fullmatch(value):
            datetime.date.fromisoformat(value)  # month 13, February 30: text
            return "date"
        match = _TIMESTAMP.fullmatch(value)
        if match:
            datetime.datetime.fromisoformat(value)
            zoned = match.group("zone") is not None
            return "timestamp with time zone" if zoned else "timestamp without time zone"
    except ValueError:
        pass
    return TEXT


def widen(current: str | None, found: str | None) -> str | None:
    """The type of a column that had values of type `current` and now one of type `found`."""
    if current is None or found is None or current == found:
        return found if current is None else current
    pair = (current, found) if (current, found) in _WIDER else (found, current)
    return _WIDER.get(pair, TEXT)


@dataclass
class Typing:
    """Column types as the records go by: inferred, or checked against what --types asked."""

    path: Path
    columns: Sequence[str]
    forced: Mapping[str, str]  # column -> type
    json: bool
    types: dict[str, str | None] = field(default_factory=dict)

    def see(self, number: int, record: Record) -> None:
        for column in self.columns:
            value = record.get(column)
            wanted = self.forced.get(column)
            if wanted is not None:
                self._check(number, column, value, wanted)
            else:
                found = type_of(value, strings=not self.json)
                self.types[column] = widen(self.types.get(column), found)

    def _check(self, number: int, column: str, value: Value, wanted: str) -> None:
        found = type_of(value)
        if isinstance(value, str) and _DIGITS.fullmatch(value) and wanted in _NUMBERS:
            found = None  # asked for: "007" reads as 7
        if found is not None and widen(found, wanted) != wanted:
            shown = as_text(value)
            shown = shown if len(shown) <= 40 else shown[:40] + "..."
            raise UsageError(
                f"{self.path}:{number}: {column} = {shown!r} is not a {wanted} (from --types)"
            )

    def result(self) -> dict[str, str]:
        return {c: self.forced.get(c) or self.types.get(c) or TEXT for c in self.columns}


def cell(value: Value, column_type: str) -> str | None:
    """A value as COPY reads it into a column of `column_type`: empty is NULL but in text."""
    if value is None or (value == "" and not column_type.startswith(_TEXT_TYPES)):
        return None
    return as_text(value)
