"""The unit tier: no database and no model, so it runs in seconds (`make test-fast`)."""

from __future__ import annotations

import pytest


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Every database fixture (db_url, conn, reviews, shop_url, ...) depends on server_url.
    if "server_url" in getattr(item, "fixturenames", ()):
        raise pytest.UsageError(
            f"{item.nodeid} needs a database: it belongs in tests/integration, not tests/unit"
        )
