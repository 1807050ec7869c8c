"""pgembed: pgvector embeddings of a table's text, kept fresh and searchable inside PostgreSQL."""

from pgembed.catalog.registry import ModelSpec
from pgembed.client import Client
from pgembed.errors import PgembedError
from pgembed.search.helpers import Hit, HybridHit

__all__ = ["Client", "Hit", "HybridHit", "ModelSpec", "PgembedError"]
