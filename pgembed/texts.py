"""Which characters leave a text blank: whitespace (POSIX [:space:], not Python's \\s, which has
\\x1c-\\x1f too) and the ones that show nothing (zero-width spaces and joiners, variation
selectors, fillers, tags, ...). The same set as the SQL's pgembed._has_text_v1
(sql/definitions/20_capture.sql), which decides which rows have a text;
tests/integration/test_search_sql.py checks that they agree on every code point.
"""

from __future__ import annotations

import re

from psycopg import sql

# A bracket expression's body written with escapes that Python's re and PostgreSQL's regular
# expressions read alike, so the SQL gets it as a bound value in any database encoding.
BLANK = (
    r"\t\n\v\f\r \u0085\u00a0\u00ad\u034f\u061c\u115f\u1160\u1680\u17b4\u17b5"
    r"\u180b-\u180f\u2000-\u200f\u2028-\u202f\u205f-\u206f\u2800\u3000\u3164"
    r"\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    r"\U000e0000-\U000e007f\U000e0100-\U000e01ef"
)

# The blank characters a text starts with, for PostgreSQL's substring(text, pattern).
LEADING_BLANKS = f"^[{BLANK}]*"
# How much of a text's start the SQL looks through for its first character that is not blank:
# a regular expression converts what it reads to 4-byte characters, so not a 100 MB text whole.
LEADING_BLANK_CHARS = 1_048_576

_VISIBLE = re.compile(f"[^{BLANK}]")
_LEADING = re.compile(LEADING_BLANKS)


def has_text(text: str) -> bool:
    """Whether `text` has a character that is not blank: a row's text without one is not
    embedded, and a query text without one is refused."""
    return _VISIBLE.search(text) is not None


def from_first_word(text: str, limit: int | None = None) -> str:
    """`text` from its first character that is not blank (at most `limit` characters of it:
    a long text is not copied whole first), as the sync worker reads a row (sync/store.py):
    else a text led by more blanks than the model reads is embedded empty."""
    found = _LEADING.match(text)  # always matches, if only the empty string
    start = found.end() if found else 0
    return text[start:] if limit is None else text[start : start + limit]


def first_word_sql(text: sql.Composable) -> sql.Composed:
    """SQL for `text` from its first character that is not blank, at most `%s` characters: its
    parameters are FIRST_WORD_PARAMS, then that length."""
    return sql.SQL(
        "pg_catalog.substr({t}, 1 OPERATOR(pg_catalog.+) pg_catalog.length(pg_catalog.substring("
        "pg_catalog.left({t}, %s::integer), %s)), %s::integer)"
    ).format(t=text)


FIRST_WORD_PARAMS = (LEADING_BLANK_CHARS, LEADING_BLANKS)
