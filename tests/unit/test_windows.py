"""windows.split: overlapping windows of word pieces, as character spans of the text."""

from __future__ import annotations

import pytest

from pgembed.encode import windows


def pieces(text: str) -> list[tuple[int, int]]:
    """Offsets of a toy tokenizer: every word is one piece, "##" splits a word in two."""
    found, start = [], 0
    for word in text.split(" "):
        for part in word.split("##"):
            found.append((start, start + len(part)))
            start += len(part)
        start += 1  # the space
    return found


def spans_text(text: str, found: windows.Windows) -> list[str]:
    plain = text.replace("##", "")
    return [plain[a:b] for a, b in found.spans]


def test_a_text_within_the_window_has_no_more_windows() -> None:
    assert windows.split(pieces("a b c"), size=3, overlap=1, max_windows=8) == windows.Windows(
        [], False
    )


def test_windows_overlap_and_cover_the_text() -> None:
    text = "w0 w1 w2 w3 w4 w5 w6 w7 w8 w9"
    found = windows.split(pieces(text), size=4, overlap=1, max_windows=8)
    assert spans_text(text, found) == ["w3 w4 w5 w6", "w6 w7 w8 w9"]
    assert not found.rest


def test_a_window_starts_at_a_word_not_inside_one() -> None:
    text = "aa bb cc dd##ee ff gg hh"  # pieces: aa bb cc dd ee ff gg hh, ee continues dd
    found = windows.split(pieces(text), size=6, overlap=2, max_windows=8)
    # The second window would start at "ee" (inside "ddee"): it starts at the next word.
    assert spans_text(text, found) == ["ff gg hh"]


def test_the_last_window_cap_marks_the_rest() -> None:
    text = " ".join(f"w{i}" for i in range(20))
    found = windows.split(pieces(text), size=4, overlap=0, max_windows=3)
    assert spans_text(text, found) == ["w4 w5 w6 w7", "w8 w9 w10 w11"]
    assert found.rest


@pytest.mark.parametrize(("size", "overlap"), [(0, 0), (4, 4), (4, -1)])
def test_impossible_windows_are_refused(size: int, overlap: int) -> None:
    with pytest.raises(ValueError, match="cannot overlap"):
        windows.split(pieces("a b c"), size=size, overlap=overlap, max_windows=2)
