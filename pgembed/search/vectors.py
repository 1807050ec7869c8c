"""Query vectors: a text embedded with exactly its model's settings, the same text again from an
LRU cache bounded in entries and in bytes, and which settings this process has loaded a model for
(warm)."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pgembed import defaults
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.embedder import Vectors
from pgembed.encode.settings import settings_of

# Settings this process has embedded a query with: their model is loaded, so a search goes
# straight to embedding (see _before_the_model).
warm: set[embedder.Settings] = set()

_Key = tuple[embedder.Settings, str]


@dataclass(frozen=True)
class CacheInfo:
    hits: int
    misses: int
    currsize: int  # entries
    bytes: int  # what the entries hold: their texts (as Python keeps them) and vectors
    maxsize: int
    max_bytes: int


class QueryCache:
    """Least recently used query vectors, at most `maxsize` entries and `max_bytes` bytes.

    A bound in entries alone lets long texts grow it: 1,024 texts of 10,000 characters are 40 MB.
    """

    def __init__(self, maxsize: int, max_bytes: int) -> None:
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self._entries: OrderedDict[_Key, tuple[Vectors, int]] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._lock = threading.Lock()

    def get(self, key: _Key, compute: Callable[[], Vectors]) -> Vectors:
        """The cached vector of `key`, else compute() (outside the lock: encodes may overlap)."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self._hits += 1
                return found[0]
            self._misses += 1
        vector = compute()
        self._put(key, vector)
        return vector

    def peek(self, key: _Key) -> Vectors | None:
        """The cached vector of `key` (counted as a hit), or None (not counted: the caller
        computes it and `put`s it)."""
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            return found[0]

    def put(self, key: _Key, vector: Vectors) -> None:
        with self._lock:
            self._misses += 1
        self._put(key, vector)

    def _put(self, key: _Key, vector: Vectors) -> None:
        size = sys.getsizeof(key[1]) + vector.nbytes
        if size > self.max_bytes:
            return  # larger than the whole cache: never kept
        with self._lock:
            old = self._entries.pop(key, None)
            self._bytes += size - (old[1] if old else 0)
            self._entries[key] = (vector, size)
            while len(self._entries) > self.maxsize or self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(
                self._hits,
                self._misses,
                len(self._entries),
                self._bytes,
                self.maxsize,
                self.max_bytes,
            )


_cache = QueryCache(defaults.QUERY_CACHE_SIZE, defaults.QUERY_CACHE_BYTES)


def embed_query(spec: ModelSpec, text: str) -> Vectors:
    """The query's vector with the model's exact settings; repeated texts come from the cache.
    The text was checked by the request it came with (search/planner.py, SearchRequest)."""
    settings = settings_of(spec)
    return _cache.get((settings, text), lambda: _query_vector(settings, text))


def _query_vector(settings: embedder.Settings, text: str) -> Vectors:
    vector = embedder.get(settings).encode_queries([text]).reshape(-1)
    vector.flags.writeable = False  # shared by every caller that asks for this text
    warm.add(settings)
    return vector


def cached_query(settings: embedder.Settings, text: str) -> Vectors | None:
    """The query's vector if the cache has it (search/batching.py asks before queueing)."""
    return _cache.peek((settings, text))


def embed_queries(settings: embedder.Settings, texts: list[str]) -> list[Vectors]:
    """The vectors of several distinct query texts, encoded as one batch (search/batching.py);
    each is cached as embed_query would."""
    matrix = embedder.get(settings).encode_queries(texts, batch_size=len(texts))
    found: list[Vectors] = []
    for text, row in zip(texts, matrix, strict=True):
        vector = row.copy()
        vector.flags.writeable = False
        _cache.put((settings, text), vector)
        found.append(vector)
    warm.add(settings)
    return found


def query_cache_info() -> CacheInfo:
    return _cache.info()
