"""Embed one batch of rows, isolating failures: a bad row never fails its neighbours."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pgembed.encode import batches
from pgembed.encode.embedder import Embedder, Vectors
from pgembed.sync.store import SourceRow


@dataclass
class Embedded:
    rows: list[SourceRow] = field(default_factory=list)
    vectors: list[Vectors] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    failed: list[tuple[SourceRow, str]] = field(default_factory=list)

    def matrix(self) -> Vectors:
        return np.concatenate(self.vectors) if self.vectors else np.empty((0, 0), np.float32)


def embed_rows(embedder: Embedder, rows: Sequence[SourceRow]) -> Embedded:
    """Encode the rows in length-sorted batches; a batch that errs is bisected until the failing
    rows are alone, so a bad row costs only its own batch a few extra encodes."""
    result = Embedded()
    counts = embedder.token_counts([row.text for row in rows])  # once: to sort and to flag
    limit = embedder.info.max_seq_length
    for batch in batches.plan([min(n, limit) for n in counts], embedder.batch_size):
        _embed_into(embedder, [rows[i] for i in batch], [counts[i] for i in batch], result)
    return result


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
