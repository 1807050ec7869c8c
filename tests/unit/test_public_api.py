"""What `import pgembed` offers: the clients, the public functions and the whole error family."""

from __future__ import annotations

import inspect

import pgembed
from pgembed import errors


def test_the_public_names_are_exported() -> None:
    assert set(pgembed.__all__) == {
        "AsyncClient",
        "Client",
        "Hit",
        "HybridHit",
        "ModelSpec",
        "SyncResult",
        "add_model",
        "alter_model",
        "alter_table",
        "migrate_schema",
        "status",
        "sync_once",
        "PgembedError",
        "UsageError",
        "NotFoundError",
        "SchemaError",
        "ConfigError",
        "DatabaseError",
        "ModelLoadError",
    }
    assert all(hasattr(pgembed, name) for name in pgembed.__all__)


def test_the_errors_are_the_ones_pgembed_raises() -> None:
    for name in ("UsageError", "NotFoundError", "SchemaError", "ConfigError", "DatabaseError"):
        assert getattr(pgembed, name) is getattr(errors, name)
        assert issubclass(getattr(pgembed, name), pgembed.PgembedError)
    assert pgembed.ModelLoadError is errors.ModelLoadError


def test_the_async_client_has_the_clients_methods_as_coroutines() -> None:
    methods = ["search", "similar", "hybrid_search", "embed"]
    methods += ["migrate_schema", "add_model", "alter_model", "sync_once", "status", "close"]
    for name in methods:
        sync, async_ = getattr(pgembed.Client, name), getattr(pgembed.AsyncClient, name)
        assert inspect.iscoroutinefunction(async_), name
        assert inspect.signature(sync) == inspect.signature(async_), name


def test_the_internal_migrate_module_is_still_a_module() -> None:
    # `pgembed.migrate` is the module that applies migrations (the CLI's and tests' import);
    # the public function is `migrate_schema`.
    from pgembed import migrate

    assert inspect.ismodule(migrate) and callable(migrate.require_current)
