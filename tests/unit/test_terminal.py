"""`printable`: database text shown inert on a terminal, readable text untouched."""

from __future__ import annotations

from pgembed.cli.terminal import printable

OSC_TITLE = "\x1b]0;pwned\x07"
CSI_CLEAR = "\x1b[2J"
C1_CSI = "\x9b31m"
BIDI = "\u202eevil\u2066"


def test_escapes_and_controls_show_as_escapes() -> None:
    shown = printable(f"a{OSC_TITLE}b{CSI_CLEAR}c{C1_CSI}d{BIDI}\x00\x7f")
    assert shown == ("a\\x1b]0;pwned\\x07b\\x1b[2Jc\\x9b31md\\u202eevil\\u2066\\x00\\x7f")
    assert all(ch.isprintable() for ch in shown)


def test_newlines_are_kept_only_for_messages() -> None:
    assert printable("one\ntwo\tthree") == "one\\x0atwo\\x09three"
    assert printable("one\ntwo\tthree\r", lines=True) == "one\ntwo\tthree\\x0d"


def test_ordinary_text_is_unchanged() -> None:
    text = "Café — naïve 日本語 👩‍👩‍👧 ünïcödé"  # the family emoji keeps its zero-width joiners
    assert printable(text) == text
    assert printable(42) == "42"
