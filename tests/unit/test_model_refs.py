"""Model references resolve to local weights without loading them."""

from __future__ import annotations

from pgembed.encode import embedder


def test_local_directory_and_hub_alias_resolve_to_the_same_weights() -> None:
    path = embedder.resolve("all-MiniLM-L6-v2")
    assert embedder.resolve("sentence-transformers/all-MiniLM-L6-v2") == path
    assert embedder.resolve(path) == path
