"""Embed one batch of rows, isolating failures: a bad row never fails its neighbours."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pgembed import defaults
from pgembed.encode import batches
from pgembed.encode.embedder import Embedder, Vectors
from pgembed.sync.store import SourceRow


@dataclass
class Embedded:
    rows: list[SourceRow] = field(default_factory=list)
    vectors: list[Vectors] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    failed: list[tuple[SourceRow, str]] = field(default_factory=list)
    # A chunked model's windows past the first: (key, window number from 1, vector) each.
    chunks: list[tuple[str, int, Vectors]] = field(default_factory=list)
    reused: int = 0  # rows whose vectors were cached at an earlier try (vectorcache.py)

    def matrix(self) -> Vectors:
        return np.concatenate(self.vectors) if self.vectors else np.empty((0, 0), np.float32)

    def joined(self, other: Embedded) -> Embedded:
        """Both in one, this one's rows first (each row's vector stays at its row's position)."""
        return Embedded(
            [*self.rows, *other.rows],
            [*self.vectors, *other.vectors],
            [*self.truncated, *other.truncated],
            [*self.failed, *other.failed],
            [*self.chunks, *other.chunks],
            self.reused + other.reused,
        )


def embed_rows(embedder: Embedder, rows: Sequence[SourceRow], max_windows: int = 1) -> Embedded:
    """Encode the rows in length-sorted batches; a batch that errs is bisected until the failing
    rows are alone, so a bad row costs only its own batch a few extra encodes.

    With `max_windows` > 1 (a chunked model), a row's text is also embedded in its windows
    past the first, up to that many windows in all."""
    result = Embedded()
    counts = embedder.token_counts([row.text for row in rows])  # once: to sort and to flag
    limit = embedder.info.max_seq_length
    for batch in batches.plan([min(n, limit) for n in counts], embedder.batch_size):
        _embed_into(embedder, [rows[i] for i in batch], [counts[i] for i in batch], result)
    if max_windows > 1:
        _embed_windows(embedder, result, max_windows)
    return result


def _embed_windows(embedder: Embedder, result: Embedded, max_windows: int) -> None:
    """Embed the windows of the rows embedded so far; a row one of whose windows fails fails
    whole (its first vector is not written without the rest). Truncated: what the last window
    does not reach."""
    # Only rows past their first window (flagged truncated by _embed_into) have more windows:
    # the others need no second tokenizing.
    long = set(result.truncated)
    rows = [row for row in result.rows if row.key in long]
    found = embedder.chunk_windows([row.text for row in rows], defaults.CHUNK_OVERLAP, max_windows)
    pieces: list[SourceRow] = []
    numbers: dict[int, int] = {}  # id of a piece -> its window number
    for row, windows in zip(rows, found, strict=True):
        for number, (start, end) in enumerate(windows.spans, start=1):
            piece = SourceRow(row.key, row.text[start:end], row.text_md5)
            numbers[id(piece)] = number
            pieces.append(piece)
    result.truncated = sorted(
        row.key for row, w in zip(rows, found, strict=True) if w.rest or row.cut
    )
    embedded = embed_rows(embedder, pieces)
    for piece, vector in zip(embedded.rows, embedded.matrix(), strict=True):
        result.chunks.append((piece.key, numbers[id(piece)], vector))
    failed = {piece.key: error for piece, error in embedded.failed}
    if failed:
        _fail_rows(result, failed)


def _fail_rows(result: Embedded, failed: dict[str, str]) -> None:
    """Move the rows of `failed` keys to result.failed, with their vectors and chunks."""
    keep = [i for i, row in enumerate(result.rows) if row.key not in failed]
    matrix = result.matrix()
    result.failed.extend((row, failed[row.key]) for row in result.rows if row.key in failed)
    result.rows = [result.rows[i] for i in keep]
    result.vectors = [matrix[keep]] if keep else []
    result.truncated = [key for key in result.truncated if key not in failed]
    result.chunks = [chunk for chunk in result.chunks if chunk[0] not in failed]


def _embed_into(
    embedder: Embedder, rows: list[SourceRow], counts: list[int], result: Embedded
) -> None:
    if not rows:
        return
    try:
        vectors = embedder.encode_document_batch([row.text for row in rows])
        if not np.isfinite(vectors).all():
            raise ValueError("the model produced a non-finite vector")
    except Exception as exc:  # any model error: isolate it, never lose the batch
        if len(rows) == 1:
            result.failed.append((rows[0], f"{type(exc).__name__}: {exc}"))
            return
        middle = len(rows) // 2
        _embed_into(embedder, rows[:middle], counts[:middle], result)
        _embed_into(embedder, rows[middle:], counts[middle:], result)
        return
    limit = embedder.info.max_seq_length
    result.rows.extend(rows)
    result.vectors.append(vectors)
    cut = (row.key for row, n in zip(rows, counts, strict=True) if n > limit or row.cut)
    result.truncated.extend(cut)
