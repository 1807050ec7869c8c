"""pgembed: pgvector embeddings of a table's text, kept fresh and searchable inside PostgreSQL."""

from .catalog import ModelSpec
from .client import Client
from .errors import PgembedError
from .search import Hit, HybridHit

__all__ = ["Client", "Hit", "HybridHit", "ModelSpec", "PgembedError"]
