"""Length-sorted encode batches: a batch is padded to its longest text, so group similar lengths.

Sorting by word-piece count rather than characters matters: two texts of equal length in
characters can differ by a factor of two in word pieces (numbers, rare words, punctuation).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Batch = npt.NDArray[np.intp]

# Texts per encode call on a CPU, measured on all-MiniLM-L6-v2 at ~44 word pieces (README,
# "Performance"): on one thread batches of 16 ran 4 % faster than 32 (less padding); on two
# threads of a loaded machine 32 ran 30 % faster than 16 (fewer thread barriers); 8 was worst on
# both. A GPU wants far larger batches to fill its cores.
CPU_BATCH_SIZE = 32
CUDA_BATCH_SIZE = 256


# Keys a worker claims at once: enough texts that sorted batches pad little (with 256 claimed
# and batches of 32, ~9 % padding on ~48+-12 word-piece texts; 64 claimed: ~31 %), few enough
# that two batches (one encoding, one prefetched) finish well within the 60 s default lease.
CPU_CLAIM_SIZE = 256
CUDA_CLAIM_SIZE = 1024


def default_batch_size(device: str) -> int:
    return CUDA_BATCH_SIZE if device == "cuda" else CPU_BATCH_SIZE


def default_claim_size(device: str) -> int:
    return CUDA_CLAIM_SIZE if device == "cuda" else CPU_CLAIM_SIZE


def plan(lengths: Sequence[int], batch_size: int) -> list[Batch]:
    """Indices of `lengths` in encode batches of at most `batch_size`, longest first.

    Longest first: the first call allocates the largest buffers, later ones reuse them.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def padding(lengths: Sequence[int], batches: Sequence[Batch]) -> int:
    """Pad positions the batches would encode: each batch is as wide as its longest text."""
    sizes = np.asarray(lengths, dtype=np.int64)
    return int(sum(len(b) * int(sizes[b].max()) - int(sizes[b].sum()) for b in batches if len(b)))
