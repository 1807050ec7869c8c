from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest
from pgvector import Vector

from helpers import cli, hnsw_built_after, plans, search_on, writing_vectors
from pgembed.catalog import registry
from pgembed.encode import embedder
from pgembed.lifecycle import models
from pgembed.search import planner
from pgembed.sync import worker


@pytest.fixture
def synced(reviews: psycopg.Connection, db_url: str) -> registry.ModelSpec:
    request = models.AddRequest("minilm", "reviews", "body", precision="fp32")  # vs fp32 refs
    spec = models.add(reviews, request)[0]
    worker.Worker(db_url, worker.Options(once=True)).run()
    return spec


def test_query_finds_paraphrases(synced: registry.ModelSpec, db_url: str) -> None:
    result = cli(
        "--database-url",
        db_url,
        "query",
        "my phone runs out of power by noon",
        "--model",
        "minilm",
        "-k",
        "2",
        "--json",
    )
    assert result.exit_code == 0, result.output
    hits = json.loads(result.output)
    assert [set(h) for h in hits] == [{"key", "similarity", "text"}] * 2
    assert {h["key"] for h in hits} == {1, 2}  # the two battery complaints, no shared words
    assert hits[0]["similarity"] >= hits[1]["similarity"]


def test_query_text_output(synced: registry.ModelSpec, db_url: str) -> None:
    result = cli("--database-url", db_url, "query", "fresh fruit", "--model", "minilm", "-k", "3")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 3
    key, similarity, text = lines[0].split("\t")
    assert key in {"3", "7"} and 0 < float(similarity) <= 1 and "apple" in text.lower()


def test_query_embeds_with_the_models_settings(
    synced: registry.ModelSpec, reviews: psycopg.Connection
) -> None:
    hits = planner.query(reviews, synced, "noisy train", k=8)
    want = embedder.get(embedder.Settings("all-MiniLM-L6-v2")).encode_queries(["noisy train"])[0]
    stored: dict[int, Vector] = dict(
        reviews.execute("SELECT id, embedding_minilm FROM reviews").fetchall()
    )
    for hit in hits:
        assert hit.similarity == pytest.approx(float(stored[hit.key].to_numpy() @ want), abs=1e-5)


def test_query_uses_the_hnsw_index(synced: registry.ModelSpec, reviews: psycopg.Connection) -> None:
    rng = np.random.default_rng(0)
    loading = hnsw_built_after(reviews, "reviews")
    with loading, writing_vectors(reviews), reviews.cursor() as cur:
        cur.executemany(
            "INSERT INTO reviews (id, body, stars, embedding_minilm) VALUES (%s, %s, 1, %s)",
            [
                (100 + i, f"filler {i}", Vector(v / np.linalg.norm(v)))
                for i, v in enumerate(rng.normal(size=(2000, 384)).astype(np.float32))
            ],
        )
    reviews.execute("ANALYZE reviews")
    with plans(reviews) as found:  # a search by vector runs through pgembed.search
        hits = search_on(reviews, synced, vector=np.ones(384, dtype=np.float32), k=5)
    assert len(hits) == 5
    assert any("Index Scan using pgembed_minilm_hnsw" in plan for plan in found)


def test_query_before_sync_is_a_clear_error(reviews: psycopg.Connection, db_url: str) -> None:
    models.add(reviews, models.AddRequest("minilm", "reviews", "body", precision="fp32"))
    result = cli("--database-url", db_url, "query", "anything", "--model", "minilm")
    assert result.exit_code == 1
    assert result.output.strip() == (
        "pgembed: error: model 'minilm' has no vectors yet: run `pgembed sync`"
    )
