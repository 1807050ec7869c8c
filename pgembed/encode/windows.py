"""Overlapping windows of word pieces over a long text, as character spans of the text.

A chunked model embeds every window of a row: the first is the text itself (the model truncates
it to its window, as an unchunked model does), the others are the spans returned here. Spans are
cut at word pieces, moved to the start of a word where one begins within the overlap, so the
text a window embeds tokenizes back into (nearly) the same word pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Offsets = Sequence[tuple[int, int]]  # each word piece's (start, end) in the text


@dataclass(frozen=True)
class Windows:
    spans: list[tuple[int, int]]  # the windows after the first, as text[start:end]
    rest: bool  # word pieces remain past the last window: the row is marked truncated


def split(offsets: Offsets, size: int, overlap: int, max_windows: int) -> Windows:
    """Windows of `size` word pieces, each starting `overlap` pieces before the previous ended."""
    if size < 1 or not 0 <= overlap < size:
        raise ValueError(f"windows of {size} word pieces cannot overlap by {overlap}")
    spans: list[tuple[int, int]] = []
    end = min(size, len(offsets))  # the first window: the text itself
    while end < len(offsets) and len(spans) + 1 < max_windows:
        start = _word_start(offsets, end - overlap, end)
        end = min(start + size, len(offsets))
        spans.append((offsets[start][0], offsets[end - 1][1]))
    return Windows(spans, end < len(offsets))


def _word_start(offsets: Offsets, start: int, limit: int) -> int:
    """The first piece at or after `start` (before `limit`) that is not a word's continuation
    (its text does not touch the previous piece's), else `start` itself."""
    for i in range(max(start, 1), limit):
        if offsets[i][0] > offsets[i - 1][1]:
            return i
    return start
