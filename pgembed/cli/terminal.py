"""What the CLI prints from the database goes through `printable`: a row's text, a key, a table
or column name, a failure's error or a server message may hold terminal escapes (ESC, CSI, OSC,
C1 controls) or bidi overrides that would retitle, recolour or rewrite the user's terminal."""

from __future__ import annotations

import click

# Bidi embeddings, overrides and isolates, and the marks that reorder text around them; the line
# and paragraph separators some terminals honour. Zero-width joiners stay: emoji need them.
_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
_CONTROLS = (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0), *_BIDI)


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


# One translation table per mode: a control shows as its escape (`\x1b`), visible but inert.
_ONE_LINE = {code: _escape(code) for code in _CONTROLS}
_LINES = {code: text for code, text in _ONE_LINE.items() if chr(code) not in "\n\t"}


def printable(text: object, *, lines: bool = False) -> str:
    """`text` as a string with every control character shown as an escape; newlines and tabs
    kept when `lines` (a message of several lines), else escaped too (one field of a line)."""
    return str(text).translate(_LINES if lines else _ONE_LINE)


def echo(text: str, *, err: bool = False) -> None:
    """click.echo of a message that carries database text: its newlines and tabs kept."""
    click.echo(printable(text, lines=True), err=err)
