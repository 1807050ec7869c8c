"""`pgembed load`'s column types: which spellings count as which type, and how a column widens."""

from __future__ import annotations

import pytest

from pgembed import columntypes
from pgembed.columntypes import type_of, widen
from pgembed.errors import UsageError

TS, TSTZ = "timestamp without time zone", "timestamp with time zone"


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, None),
        ("", None),
        ("7", "bigint"),
        ("-0", "bigint"),
        ("+12", "bigint"),
        ("007", "text"),  # a code: its zeros matter
        ("9223372036854775807", "bigint"),
        ("9223372036854775808", "text"),  # beyond bigint: the digits are kept as text
        ("0.5", "double precision"),
        ("-1e3", "double precision"),
        (".5", "double precision"),
        ("1e999", "text"),  # infinite
        ("NaN", "text"),
        ("1_000", "text"),
        ("٣", "text"),  # a Unicode digit: PostgreSQL would not read it
        ("True", "boolean"),
        ("yes", "text"),
        ("2024-02-29", "date"),
        ("2023-02-29", "text"),
        ("2024-01-02T03:04", TS),
        ("2024-01-02 03:04:05.123456", TS),
        ("2024-01-02T03:04:05Z", TSTZ),
        ("2024-01-02 03:04:05+05:30", TSTZ),
        ("01/02/2024", "text"),  # read differently under each DateStyle
        (True, "boolean"),
        (7, "bigint"),
        (2**70, "text"),
        (0.25, "double precision"),
    ],
)
def test_type_of(value: columntypes.Value, want: str | None) -> None:
    assert type_of(value) == want


def test_json_strings_are_text_unless_temporal() -> None:
    assert type_of("7", strings=False) == "text"
    assert type_of("true", strings=False) == "text"
    assert type_of("2024-01-02", strings=False) == "date"


def test_widen() -> None:
    assert widen(None, "bigint") == "bigint"
    assert widen("bigint", None) == "bigint"
    assert widen("bigint", "double precision") == "double precision"
    assert widen("double precision", "bigint") == "double precision"
    assert widen("date", TS) == TS
    assert widen("date", TSTZ) == "text"
    assert widen("boolean", "bigint") == "text"
    assert widen("text", "bigint") == "text"


def test_parse_types() -> None:
    assert columntypes.parse_types("rating=int, score=FLOAT,at=timestamptz") == {
        "rating": "int",
        "score": "float",
        "at": "timestamptz",
    }
    assert columntypes.parse_types(None) == {}
    with pytest.raises(UsageError, match="write column=type"):
        columntypes.parse_types("rating")
    with pytest.raises(UsageError, match="invalid column name"):
        columntypes.parse_types('x"y=int')


def test_cells() -> None:
    assert columntypes.cell("", "bigint") is None  # empty is NULL ...
    assert columntypes.cell("", "text") == ""  # ... but in text
    assert columntypes.cell(True, "boolean") == "true"
    assert columntypes.cell(0.5, "text") == "0.5"
