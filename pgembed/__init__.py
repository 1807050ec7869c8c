"""pgembed: pgvector embeddings of a table's text, kept fresh and searchable inside PostgreSQL."""

from .catalog import ModelSpec
from .errors import PgembedError
from .search import Hit

__all__ = ["Hit", "ModelSpec", "PgembedError"]
