"""Where the database is: the URL given (option, environment), else the embedded server's.

Above both `db` (connections, given a URL) and `embedded` (which may start a server)."""

from __future__ import annotations

from pgembed import config
from pgembed.embedded import server


def resolve_url(explicit: str | None = None) -> str:
    """The URL from option or environment, else the embedded server's (started on demand)."""
    return config.database_url(explicit) or server.url()
