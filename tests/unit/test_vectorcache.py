"""The worker's cache of held rows' vectors (sync/vectorcache.py): a vector comes back only for
the same model settings and the same text, with its chunks and truncation mark, and the cache
stays within its bound."""

from __future__ import annotations

import dataclasses

import numpy as np

from pgembed.catalog.registry import ModelSpec
from pgembed.sync.isolate import Embedded
from pgembed.sync.store import SourceRow
from pgembed.sync.vectorcache import VectorCache

SPEC = ModelSpec(
    name="minilm",
    table_schema="public",
    table_name="reviews",
    key_column="id",
    key_type="integer",
    text_column="body",
    embedding_column="embedding_minilm",
    model_ref="sentence-transformers/all-MiniLM-L6-v2",
    pooling="mean",
    normalize=True,
    dimensions=3,
    max_seq_length=256,
    long_texts="chunk",
)


def embedded(keys: list[str], md5: str = "m", chunked: bool = True) -> Embedded:
    """Rows of `keys`; with `chunked`, the first is a long one with 2 more windows."""
    rows = [SourceRow(key, f"text {key}", f"{md5}{key}") for key in keys]
    vectors = np.arange(3 * len(keys), dtype=np.float32).reshape(len(keys), 3)
    windows = [(keys[0], 1, np.ones(3, np.float32)), (keys[0], 2, np.zeros(3, np.float32))]
    return Embedded(
        rows=rows,
        vectors=[vectors],
        truncated=[keys[0]] if chunked else [],
        chunks=windows if chunked else [],
    )


def test_a_cached_row_comes_back_with_its_chunks_and_mark_for_the_same_text_only() -> None:
    cache = VectorCache()
    first = embedded(["1", "2", "3"])
    cache.put(SPEC, first, {"1", "2"})
    again = [SourceRow("1", "text 1", "m1"), SourceRow("2", "changed", "other"), first.rows[2]]
    found, rest = cache.take(SPEC, again)
    assert [row.key for row in found.rows] == ["1"] and found.reused == 1
    assert [row.key for row in rest] == ["2", "3"]
    np.testing.assert_array_equal(found.matrix(), first.matrix()[:1])
    assert found.truncated == ["1"]
    assert [(key, number) for key, number, _ in found.chunks] == [("1", 1), ("1", 2)]
    # Taken once: a second take embeds it (a row written is not cached).
    assert cache.take(SPEC, again[:1])[0].reused == 0
    assert len(cache) == 0  # key 2's entry went with its changed text


def test_other_model_settings_never_take_a_cached_vector() -> None:
    cache = VectorCache()
    row = SourceRow("1", "text 1", "m1")
    cache.put(SPEC, embedded(["1"]), {"1"})
    other = dataclasses.replace(SPEC, name="other")  # another model on the same table
    assert cache.take(other, [row])[0].reused == 0
    assert cache.take(SPEC, [row])[0].reused == 1
    cache.put(SPEC, embedded(["1"]), {"1"})
    altered = dataclasses.replace(SPEC, pooling="cls", version=2)  # model alter
    found, rest = cache.take(altered, [row])
    assert found.reused == 0 and rest == [row]
    assert len(cache) == 0  # made with the old settings: never of use again


def test_the_store_drops_its_oldest_rows_past_its_bound() -> None:
    cache = VectorCache(most=7 * 3 * 4)  # bytes: 7 vectors of 3 float32
    cache.put(SPEC, embedded(["1"]), {"1"})  # 3 vectors: its own and 2 windows
    for key in "2345":
        cache.put(SPEC, embedded([key], chunked=False), {key})
    assert len(cache) == 5  # 3 + 4 = 7 vectors: all held
    cache.put(SPEC, embedded(["6"]), {"6"})  # 3 more: key 1 goes, and 3 vectors are 7 again
    assert len(cache) == 5
    cache.put(SPEC, embedded(["7"]), {"7"})  # 3 more: keys 2, 3 and 4 go
    found, _ = cache.take(SPEC, [SourceRow(k, "", f"m{k}") for k in "1234567"])
    assert [row.key for row in found.rows] == ["5", "6", "7"]
