"""Length-sorted encode batches: a batch is padded to its longest text, so group similar lengths.

Sorting by word-piece count rather than characters matters: two texts of equal length in
characters can differ by a factor of two in word pieces (numbers, rare words, punctuation).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Batch = npt.NDArray[np.intp]


def plan(lengths: Sequence[int], batch_size: int) -> list[Batch]:
    """Indices of `lengths` in encode batches of at most `batch_size`, longest first.

    Longest first: the first call allocates the largest buffers, later ones reuse them.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
