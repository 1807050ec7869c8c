"""Where pgembed's settings come from: the database URL and the data directory."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import platformdirs

from pgembed.errors import ConfigError

URL_ENV_VARS = ("PGEMBED_DATABASE_URL", "DATABASE_URL")


def database_url(explicit: str | None = None) -> str | None:
    """The URL to use, or None for the embedded server (option, then environment)."""
    if explicit:
        return validate_url(explicit)
    for var in URL_ENV_VARS:
        value = os.environ.get(var)
        if value:
            return validate_url(value)
    return None


def validate_url(url: str) -> str:
    """Refuse anything that is not a postgres:// or postgresql:// URL, without echoing secrets."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError as exc:
        raise ConfigError(f"malformed database URL {redact(url)!r}: {exc}") from None
    if parts.scheme not in ("postgres", "postgresql"):
        raise ConfigError(
            f"malformed database URL {redact(url)!r}: expected postgresql://user@host:port/dbname"
        )
    return url


def redact(url: str) -> str:
    """The URL with any password replaced by '***'; safe to print or log.

    Covers the user part (`user:secret@host`) and `password=` anywhere else: a query parameter
    (`?password=secret`) or a keyword connection string (`host=h password=secret`).
    """
    masked = _PASSWORD_PARAM.sub(r"\1***", url)
    try:
        parts = urlsplit(masked)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return masked
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))


_PASSWORD_PARAM = re.compile(r"(\bpassword\s*=\s*)('[^']*'|[^&\s]*)", re.IGNORECASE)


def home(*, create: bool = True) -> Path:
    """pgembed's data directory: $PGEMBED_HOME, else the per-user data directory."""
    value = os.environ.get("PGEMBED_HOME")
    path = Path(value) if value else Path(platformdirs.user_data_dir("pgembed"))
    if not create:
        return path.resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create pgembed's data directory {path}: {exc}") from None
    return path.resolve()
