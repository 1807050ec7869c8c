"""Bounded resources: a huge row is read and tokenized only as far as the model can read it (and
marked truncated); query texts are limited on every path; the query cache is bounded in bytes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import urllib.error
import urllib.request

import numpy as np
import psycopg
import pytest
from sentence_transformers import SentenceTransformer

import pgembed
from helpers import cli
from pgembed import defaults
from pgembed.catalog import registry
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.errors import UsageError
from pgembed.lifecycle import models
from pgembed.search import vectors
from pgembed.search.planner import SearchRequest
from pgembed.serve.api import Api
from pgembed.serve.server import SearchServer
from pgembed.sync import store, worker

MINILM = embedder.Settings("all-MiniLM-L6-v2")


def test_a_huge_row_is_embedded_from_its_first_characters_and_marked_truncated(
    conn: psycopg.Connection, db_url: str
) -> None:
    conn.execute("CREATE TABLE docs (id bigint PRIMARY KEY, body text)")
    spec = models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))[0]
    conn.execute(
        "INSERT INTO docs SELECT 1, string_agg('word' || (g % 997), ' ') "
        "FROM generate_series(1, 600000) g"  # ~4 MB of words
    )
    # Cut by characters but only 2 word pieces in what is read: marked truncated all the same.
    conn.execute("INSERT INTO docs VALUES (2, 'a' || repeat(' ', 3000000) || 'b'), (3, 'short')")
    chars = defaults.CHARS_PER_WORD_PIECE * spec.max_seq_length
    read = {row.key: row for row in store.read(conn, spec, ["1", "2", "3"])}
    full = {str(k): t for k, t in conn.execute("SELECT id, body FROM docs")}
    assert len(full["1"]) > 4_000_000 and len(read["1"].text) == chars
    assert [read[k].cut for k in "123"] == [True, True, False]
    assert all(read[k].text_md5 == hashlib.md5(full[k].encode()).hexdigest() for k in "123")

    stats = worker.Worker(db_url, worker.Options(once=True)).run()
    assert (stats.written, stats.failed) == (3, 0)
    truncated = conn.execute("SELECT key FROM pgembed.truncated ORDER BY key").fetchall()
    assert truncated == [("1",), ("2",)]
    got = conn.execute("SELECT embedding_minilm FROM docs WHERE id = 1").fetchone()
    assert got is not None
    # The cut is far beyond the model's window: the model alone, given 100,000 characters
    # (it truncates to 256 word pieces itself), makes the same vector.
    plain = SentenceTransformer(embedder.resolve("all-MiniLM-L6-v2"), device="cpu")
    want = plain.encode([full["1"][:100_000]], normalize_embeddings=True)[0]
    assert float(np.dot(want, got[0].to_numpy())) > 0.9999


def test_only_the_cut_text_is_tokenized() -> None:
    model = embedder.get(MINILM)
    huge = "word " * 1_000_000  # 5 MB: whole, it would be 1,000,002 word pieces
    assert model.max_chars == defaults.CHARS_PER_WORD_PIECE * 256
    assert model.token_counts([huge])[0] < 2 + model.max_chars // 4  # a few per "word "
    np.testing.assert_array_equal(
        model.encode_queries([huge]), model.encode_queries([huge[: model.max_chars]])
    )


@pytest.fixture
def long_query() -> str:
    return "x" * (defaults.MAX_QUERY_CHARS + 1)


def test_query_text_is_limited_on_every_path(spec: ModelSpec, db_url: str, long_query: str) -> None:
    with pytest.raises(UsageError, match="at most 10000"):
        SearchRequest("minilm", text=long_query)  # what every path builds, SQLAlchemy's too
    with pgembed.Client(db_url) as client, pytest.raises(UsageError, match="at most"):
        client.search("minilm", long_query)

    async def search_async() -> None:
        async with pgembed.AsyncClient(db_url) as client:
            await client.hybrid_search("minilm", long_query)

    with pytest.raises(UsageError, match="at most"):
        asyncio.run(search_async())
    result = cli("--database-url", db_url, "query", long_query, "--model", "minilm")
    assert result.exit_code == 2 and "at most" in result.output

    api = Api(db_url)
    served = SearchServer(api, "127.0.0.1", 0)
    served.start()
    try:
        body = json.dumps({"text": long_query, "model": "minilm"}).encode()
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(f"{served.url}/search", data=body, headers=headers)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=60)
        assert caught.value.code == 400 and "at most" in caught.value.read().decode()
        caught.value.close()
    finally:
        served.stop()


def test_the_query_cache_is_bounded_in_bytes(spec: ModelSpec, conn: psycopg.Connection) -> None:
    assert vectors.query_cache_info().max_bytes == defaults.QUERY_CACHE_BYTES
    settings = settings_of(registry.get(conn, "minilm"))
    model = embedder.get(settings)
    cache = vectors.QueryCache(maxsize=1000, max_bytes=100_000)
    texts = [f"query {i}: " + "is the battery any good " * 400 for i in range(20)]  # ~10 kB
    vector: embedder.Vectors = model.encode_queries([texts[0]])[0]  # one real vector, reused
    calls: list[str] = []

    def counted(text: str) -> embedder.Vectors:
        calls.append(text)
        return vector

    for text in texts:
        cache.get((settings, text), lambda text=text: counted(text))  # type: ignore[misc]
    info = cache.info()
    assert info.misses == 20 and 0 < info.bytes <= 100_000
    assert info.currsize < 20  # the entry bound (1000) never came into play
    calls.clear()
    cache.get((settings, texts[-1]), lambda: counted(texts[-1]))  # recent: still there
    cache.get((settings, texts[0]), lambda: counted(texts[0]))  # oldest: evicted
    assert calls == [texts[0]]
    huge = vectors.QueryCache(maxsize=10, max_bytes=1_000)  # one entry is larger than the cache
    huge.get((settings, texts[0]), lambda: counted(texts[0]))
    assert huge.info().currsize == 0 and huge.info().bytes == 0
