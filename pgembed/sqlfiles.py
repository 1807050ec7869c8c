"""Static SQL lives in sql/*.sql under `-- name: x` headers and is loaded once."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import LiteralString, cast

_SQL_DIR = Path(__file__).parent / "sql"
_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


@cache
def _load(group: str) -> dict[str, str]:
    text = (_SQL_DIR / f"{group}.sql").read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def get(group: str, name: str) -> LiteralString:
    """The named statement; the cast is sound because the text is a file in the package."""
    return cast(LiteralString, _load(group)[name])  # type: ignore[redundant-cast]


def statements(group: str, name: str) -> list[LiteralString]:
    """A named block of several statements, one per `;` at a line's end, to run in order with
    the same parameters (the extended protocol takes one statement at a time)."""
    body = _load(group)[name]
    parts = [part.strip() for part in re.split(r";\s*$", body, flags=re.MULTILINE)]
    return [cast(LiteralString, part) for part in parts if part]
