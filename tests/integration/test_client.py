"""pgembed.Client: the Python API over the same SQL helpers, with the models' exact settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psycopg
import pytest
from pgvector import Vector

from pgembed import Client, Hit, HybridHit, db
from pgembed.catalog import registry
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.errors import NotFoundError, SchemaError, UsageError
from pgembed.lifecycle import models
from pgembed.search import vectors
from pgembed.sync import worker

QUERY = "phone battery does not last the day"


@pytest.fixture
def client(shop_url: str) -> Iterator[Client]:
    with Client(shop_url) as c:
        yield c


def test_search_returns_hits_with_text_like_the_sql_helper(client: Client, shop_url: str) -> None:
    hits = client.search("minilm", QUERY, k=5)
    assert len(hits) == 5 and all(isinstance(h, Hit) for h in hits)
    with db.connection(shop_url) as conn:
        spec = registry.get(conn, "minilm")
        q = Vector(embedder.get(settings_of(spec)).encode_queries([QUERY])[0])
        sql = conn.execute("SELECT * FROM pgembed.search('minilm', %s, 5)", (q,)).fetchall()
        texts = dict(conn.execute("SELECT id, text FROM reviews").fetchall())
    assert [h.key for h in hits] == [int(key) for key, _ in sql]  # the key column's own type
    np.testing.assert_allclose([h.similarity for h in hits], [s for _, s in sql], atol=1e-6)
    assert all(h.text == texts[h.key] for h in hits)
    with pytest.raises(dataclasses.FrozenInstanceError):
        hits[0].key = "x"  # type: ignore[misc]


def test_filter_similar_and_hybrid(client: Client, shop_url: str) -> None:
    good = client.search("minilm", QUERY, k=8, filter={"rating": {"$gte": 4}, "category": "phones"})
    with db.connection(shop_url) as conn:
        keys = [h.key for h in good]
        found = conn.execute(
            "SELECT DISTINCT category, rating >= 4 FROM reviews WHERE id = ANY(%s)", (keys,)
        ).fetchall()
    assert len(good) == 8 and found == [("phones", True)]
    similar = client.similar("minilm", 1, k=4)
    assert len(similar) == 4 and 1 not in {h.key for h in similar}
    assert client.similar("minilm", "1", k=4) == similar
    hybrid = client.hybrid_search("minilm", "stamina of a goldfish", k=3)
    assert all(isinstance(h, HybridHit) for h in hybrid)
    assert hybrid[0].key == 4 and "goldfish" in hybrid[0].text
    assert hybrid[0].score > hybrid[1].score > 0


def test_database_url_resolves_like_the_cli(shop_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGEMBED_DATABASE_URL", shop_url)
    with Client() as client:
        assert client.url == shop_url
        assert len(client.search("minilm", QUERY, k=2)) == 2


def test_embed_uses_every_setting_of_the_model(reviews: psycopg.Connection, db_url: str) -> None:
    request = models.AddRequest(
        "custom",
        "reviews",
        "body",
        pooling="cls",
        normalize=False,
        max_seq_length=12,
        query_prefix="query: ",
        document_prefix="passage: ",
    )
    models.add(reviews, request)
    worker.Worker(db_url, worker.Options(once=True)).run()
    stored: dict[str, Vector] = dict(
        reviews.execute("SELECT body, embedding_custom FROM reviews").fetchall()
    )
    texts = list(stored)
    with Client(db_url) as client:
        vectors = client.embed("custom", texts)
        for text, vector in zip(texts, vectors, strict=True):
            np.testing.assert_allclose(vector, stored[text].to_numpy(), atol=1e-4)
        # Queries get the query prefix, not the document one; search embeds them the same way.
        query = client.embed("custom", [texts[0]], queries=True)[0]
        assert not np.allclose(query, vectors[0], atol=1e-3)
        top = client.search("custom", texts[0], k=1)[0]
        target = stored[top.text].to_numpy()
        cosine = query @ target / (np.linalg.norm(query) * np.linalg.norm(target))
        assert top.similarity == pytest.approx(cosine, abs=1e-5)
        with pytest.raises(UsageError, match="list of texts"):
            client.embed("custom", "one string")


def test_repeated_queries_come_from_the_cache(client: Client) -> None:
    text = "a query text nobody else asks: is the hinge sturdy?"
    before = vectors.query_cache_info()
    first = client.search("minilm", text, k=3)
    middle = vectors.query_cache_info()
    second = client.search("minilm", text, k=3)
    after = vectors.query_cache_info()
    assert middle.misses == before.misses + 1
    assert after.misses == middle.misses and after.hits == middle.hits + 1
    assert first == second


def test_one_model_shared_by_threads(client: Client, shop_url: str) -> None:
    with db.connection(shop_url) as conn:
        settings = settings_of(registry.get(conn, "minilm"))
    loaded = embedder.get(settings)
    texts = [f"{QUERY} #{i % 3}" for i in range(12)]
    expected = [client.search("minilm", t, k=3) for t in texts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(lambda t: client.search("minilm", t, k=3), texts))
        embedded = list(pool.map(lambda t: client.embed("minilm", [t]), texts))
    assert got == expected
    assert embedder.get(settings) is loaded  # loaded once, not once per thread
    np.testing.assert_allclose(embedded[0], embedded[3], atol=1e-6)


def test_errors_are_pgembed_errors(client: Client, empty_db_url: str) -> None:
    with pytest.raises(NotFoundError, match="unknown model 'nope'"):
        client.search("nope", QUERY)
    with pytest.raises(UsageError, match='has no column "ratings"'):
        client.search("minilm", QUERY, filter={"ratings": 5})
    with pytest.raises(UsageError, match="unknown operator"):
        client.search("minilm", QUERY, filter={"rating": {"$like": "%"}})
    with pytest.raises(UsageError, match="k must be an integer from 1"):
        client.search("minilm", QUERY, k=0)
    with pytest.raises(UsageError, match="ef_search must be an integer from 1 to 1000, not 0"):
        client.search("minilm", QUERY, ef_search=0)
    with pytest.raises(NotFoundError, match="no row with id"):
        client.similar("minilm", 123456)
    with pytest.raises(SchemaError, match="run `pgembed migrate`"):
        Client(empty_db_url).search("minilm", QUERY)
    assert len(client.search("minilm", QUERY, k=1, ef_search=200)) == 1  # still usable
