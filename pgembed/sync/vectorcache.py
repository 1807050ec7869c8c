"""A cache of the vectors of rows a write-back could not write because another transaction held
them, for the row's next try: a row an application holds for long is tried again 1 s to a minute
apart (batch.py), and while its text is the same it is not embedded again at each try.

A cached vector is used only for the same model settings (the whole ModelSpec) and the same text
(md5, as read at the try); the write-back's md5 guard stands behind it as for any vector. The
cache is this worker's, in memory, bounded (CACHE_BYTES), least recently put first out."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from pgembed.catalog.registry import ModelSpec
from pgembed.encode.embedder import Vectors
from pgembed.sync.isolate import Embedded
from pgembed.sync.store import SourceRow

# The held rows of a few batches, chunks included: 16,384 vectors of 384 dimensions (float32), a
# tenth as many of 4096. Bytes, not vectors, so a wide model keeps fewer.
CACHE_BYTES = 25 * 2**20


@dataclass(frozen=True)
class _Entry:
    spec: ModelSpec
    text_md5: str
    vector: Vectors  # the row's own (first window's)
    truncated: bool
    chunks: tuple[tuple[int, Vectors], ...]  # a chunked model's windows past the first

    @property
    def size(self) -> int:
        """Its bytes of vectors."""
        return int(self.vector.nbytes) + sum(int(v.nbytes) for _, v in self.chunks)


class VectorCache:
    """Thread-safe: the encode thread takes, the I/O thread keeps (pipeline.py)."""

    def __init__(self, most: int = CACHE_BYTES) -> None:
        self._most = most
        self._size = 0
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, spec: ModelSpec, embedded: Embedded, keys: Iterable[str]) -> None:
        """Cache the vectors `embedded` has of `keys` (rows it failed on have none)."""
        wanted = set(keys)
        if not wanted:
            return
        matrix = embedded.matrix()
        truncated = set(embedded.truncated)
        chunks: dict[str, list[tuple[int, Vectors]]] = {}
        for key, number, vector in embedded.chunks:
            if key in wanted:
                # A copy: a window's vector is a view of its whole batch's matrix.
                chunks.setdefault(key, []).append((number, vector.copy()))
        with self._lock:
            for i, row in enumerate(embedded.rows):
                if row.key in wanted:
                    entry = _Entry(
                        spec,
                        row.text_md5,
                        matrix[i].copy(),
                        row.key in truncated,
                        tuple(chunks.get(row.key, ())),
                    )
                    self._put((spec.name, row.key), entry)

    def take(self, spec: ModelSpec, rows: Sequence[SourceRow]) -> tuple[Embedded, list[SourceRow]]:
        """The rows cached for this model's settings and their text as read now, as an Embedded
        (its `reused` their count), and the rows left to embed. A row's entry leaves the cache
        either way: it is written now, or made for another text or settings."""
        found = Embedded()
        rest: list[SourceRow] = []
        vectors: list[Vectors] = []
        with self._lock:
            for row in rows:
                entry = self._drop((spec.name, row.key))
                if entry is None or entry.spec != spec or entry.text_md5 != row.text_md5:
                    rest.append(row)
                    continue
                found.rows.append(row)
                vectors.append(entry.vector)
                if entry.truncated:
                    found.truncated.append(row.key)
                found.chunks.extend((row.key, number, v) for number, v in entry.chunks)
        if vectors:
            found.vectors.append(np.stack(vectors))
        found.reused = len(found.rows)
        return found, rest

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _put(self, slot: tuple[str, str], entry: _Entry) -> None:
        self._drop(slot)
        self._entries[slot] = entry
        self._size += entry.size
        while self._size > self._most and self._entries:
            _, oldest = self._entries.popitem(last=False)
            self._size -= oldest.size

    def _drop(self, slot: tuple[str, str]) -> _Entry | None:
        old = self._entries.pop(slot, None)
        if old is not None:
            self._size -= old.size
        return old
