"""pgembed: pgvector embeddings of a table's text, kept fresh and searchable inside PostgreSQL.

The public Python API (docs/python.md): `Client` and `AsyncClient` search and embed; the functions
`migrate_schema`, `add_model`, `alter_model`, `alter_table`, `sync_once` and `status` do what the
CLI's commands of those names do; every error is a `PgembedError`.
"""

from pgembed.aclient import AsyncClient
from pgembed.api import (
    SyncResult,
    add_model,
    alter_model,
    alter_table,
    migrate_schema,
    status,
    sync_once,
)
from pgembed.catalog.registry import ModelSpec
from pgembed.client import Client
from pgembed.errors import (
    ConfigError,
    DatabaseError,
    ModelLoadError,
    NotFoundError,
    PgembedError,
    SchemaError,
    UsageError,
)
from pgembed.search.planner import Hit, HybridHit

__all__ = [
    "AsyncClient",
    "Client",
    "ConfigError",
    "DatabaseError",
    "Hit",
    "HybridHit",
    "ModelLoadError",
    "ModelSpec",
    "NotFoundError",
    "PgembedError",
    "SchemaError",
    "SyncResult",
    "UsageError",
    "add_model",
    "alter_model",
    "alter_table",
    "migrate_schema",
    "status",
    "sync_once",
]
