"""Query vectors: a text embedded with exactly its model's settings, the same text again from an
LRU cache, and which settings this process has loaded a model for (warm)."""

from __future__ import annotations

import functools

from pgembed import defaults
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.embedder import Vectors
from pgembed.lifecycle import models

# Settings this process has embedded a query with: their model is loaded, so a search goes
# straight to embedding (see _before_the_model).
warm: set[embedder.Settings] = set()


def embed_query(spec: ModelSpec, text: str) -> Vectors:
    """The query's vector with the model's exact settings; repeated texts come from an LRU cache."""
    return _query_vector(models.settings_of(spec), text)


@functools.lru_cache(maxsize=defaults.QUERY_CACHE_SIZE)
def _query_vector(settings: embedder.Settings, text: str) -> Vectors:
    vector = embedder.get(settings).encode_queries([text]).reshape(-1)
    vector.flags.writeable = False  # shared by every caller that asks for this text
    warm.add(settings)
    return vector


def query_cache_info() -> functools._CacheInfo:
    return _query_vector.cache_info()
