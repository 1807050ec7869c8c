"""Where pgembed's settings come from: the database URL and the data directory."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import platformdirs
import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgembed.errors import ConfigError

URL_ENV_VARS = ("PGEMBED_DATABASE_URL", "DATABASE_URL")


def database_url(explicit: str | None = None) -> str | None:
    """The URL to use, or None for the embedded server (option, then environment).

    An empty URL given explicitly is refused: read from an unset variable of the caller's, it
    would otherwise pick another database (the environment's, or the embedded server)."""
    if explicit is not None:
        if not isinstance(explicit, str):
            raise ConfigError(f"the database URL must be a string, not {type(explicit).__name__}")
        if not explicit.strip():
            raise ConfigError(
                f"the database URL is empty; {EXPECTED} (or give none: $PGEMBED_DATABASE_URL, "
                "else the embedded server)"
            )
        return validate_url(explicit)
    for var in URL_ENV_VARS:
        value = os.environ.get(var)
        if value:
            return validate_url(value)
    return None


def validate_url(url: str) -> str:
    """Refuse anything that is not a postgres:// or postgresql:// URL libpq reads as written.

    Checked before the driver sees the URL: libpq's own errors about a malformed one quote parts
    of it, a password among them (`failed to resolve host 'ss@host'` for `u:pa@ss@host`)."""
    scheme, sep, _ = url.partition("://")
    if not (sep and _SCHEME.fullmatch(scheme)):
        # Without a scheme no part of it is known to be a password: none of it is quoted.
        raise ConfigError(f"malformed database URL (not shown): {_schemeless(url)}; {EXPECTED}")
    if scheme not in ("postgres", "postgresql"):
        problem: str | None = f"the scheme is {scheme!r}, not postgresql:// or postgres://"
    else:
        problem = _misread(url)
    if problem:
        raise ConfigError(f"malformed database URL {redact(url)!r}: {problem}")
    return url


EXPECTED = "write postgresql://user:password@host:port/dbname"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,19}")


def _schemeless(url: str) -> str:
    """What is wrong with a URL that has no `scheme://`, in words that quote none of it."""
    head = url.lower()
    if head.startswith(("postgresql:", "postgres:")):
        return "no '//' after the scheme"
    if head.startswith(("postgresql/", "postgres/")):
        return "no ':' between the scheme and '//'"
    fields = url.split(":")
    if len(fields) >= 5 and (fields[1].isdigit() or fields[1] == "*"):
        return "this is a .pgpass line (host:port:database:user:password), not a URL"
    if "=" in url:
        return "a keyword connection string (host=... dbname=...) is not accepted"
    return "no postgresql:// scheme"


def _misread(url: str) -> str | None:
    """Why libpq would not read `url` as its author meant, or None; never quotes the URL."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an IPv6 host's '[' without its ']' (or the reverse), or else
        if "IPv6" in str(exc):
            return f"a '[' or ']' of an IPv6 host without its pair ({ENCODE_HINT})"
        return f"the URL's host and user part is not valid ({ENCODE_HINT})"
    try:
        if "," not in parts.netloc:  # libpq takes `h1:5432,h2:5433`; urlsplit does not
            parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        return f"the port is not a number from 0 to 65535 ({ENCODE_HINT})"
    try:
        options = conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        return f"{unquoted(exc)} ({ENCODE_HINT})"
    if "@" in str(options.get("host") or "") or "@" in parts.path:
        return f"an '@' after the user name and password ({ENCODE_HINT})"
    return None


def unquoted(exc: Exception) -> str:
    """libpq's complaint about a connection string without the text it quotes, which may be a
    password."""
    return _QUOTED.sub('"..."', str(exc).strip())


ENCODE_HINT = "percent-encode @ : / ? # & [ ] in a user name or password, e.g. @ as %40"
_QUOTED = re.compile(r'"[^"]*"')


def redact(url: str) -> str:
    """The URL (or keyword connection string) with every password replaced by '***': safe to
    print or log.

    Masks `user:secret@` (up to the last '@', as a password may hold '@', '/', '?' or '#'),
    `?password=secret` and `sslpassword=` in a query (key percent-encoded or not, the value up to
    the next `&key=`), and `password=secret` or `password='...'` in a keyword string; anything
    else without a scheme (`postgres:secret@host`, a .pgpass line) is not shown at all. Masks
    too much rather than too little."""
    scheme, sep, rest = url.partition("://")
    if not (sep and _SCHEME.fullmatch(scheme)):
        return _KEYWORD.sub(_mask, url) if _is_keyword_string(url) else "(not shown)"
    return f"{scheme}://{_redact_userinfo(_QUERY_PARAM.sub(_mask, rest))}"


def _is_keyword_string(text: str) -> bool:
    """Whether `text` reads as `key=value ...`: else which part is a password is unknown
    (`postgres:secret@host`, a .pgpass line)."""
    return _KEYWORD_START.match(text) is not None


def without_password(url: str) -> str:
    """A valid URL without its password, in the user part or the query."""
    parts = urlsplit(url)
    userinfo, at, hostinfo = parts.netloc.rpartition("@")
    netloc = f"{userinfo.partition(':')[0]}{at}{hostinfo}"
    params = [p for p in parts.query.split("&") if unquote(p.partition("=")[0]) != "password"]
    return urlunsplit(parts._replace(netloc=netloc, query="&".join(params)))


def _redact_userinfo(rest: str) -> str:
    head, at, tail = rest.rpartition("@")
    user_end = re.search(r"[:/?#@]", head) if at else None
    if user_end is None or user_end.group() != ":" or user_end.end() == len(head):
        return rest  # no password (`user@host`, `user:@host`, an '@' only in the query)
    return f"{head[: user_end.start()]}:***@{tail}"


def _mask(match: re.Match[str]) -> str:
    if not unquote(match["key"]).lower().endswith("password"):
        return match[0]
    return f"{match['key']}{match['eq']}***"


_KEY = r"(?P<key>(?:[\w.-]|%[0-9A-Fa-f]{2})+)"
# In a query a value runs to the next `&key=`: libpq splits `password=a&b` at '&' and then quotes
# `b` in its error, so `b` is masked too.
_QUERY_PARAM = re.compile(rf"(?<=[?&]){_KEY}(?P<eq>=)(?P<value>[^&]*(?:&[^&=]*(?=&|$))*)")
_KEYWORD_START = re.compile(r"\s*[A-Za-z_]\w*\s*=")
_KEYWORD = re.compile(
    rf"(?<![\w%]){_KEY}(?P<eq>\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|\S*(?:\s+[^\s=']+(?=\s|$)(?!\s*=))*)"
)


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
