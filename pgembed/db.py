"""Connections to a given URL: pinned session settings, pgvector's binary types, errors a user can
read, and pools. Finding the URL (perhaps starting the embedded server) is `locate`'s."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import partial
from typing import Any

import psycopg
from pgvector.psycopg.vector import register_vector_info
from psycopg import sql
from psycopg.types import TypeInfo
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgembed import checks, config, defaults, sqlfiles
from pgembed.errors import ConfigError, DatabaseError

APPLICATION_NAME = "pgembed"


def connect(url: str, *, autocommit: bool = True, vector: bool = True) -> psycopg.Connection:
    """Open a connection with pgembed's pinned settings (sql/session.sql); with `vector`,
    pgvector's types travel in binary."""
    try:
        conn = psycopg.connect(url, **{**_connect_options(), "autocommit": autocommit})
    except psycopg.ProgrammingError as exc:
        raise ConfigError(
            f"malformed database URL {config.redact(url)!r}: {config.unquoted(exc)}"
        ) from None
    except psycopg.OperationalError as exc:
        said = f"cannot connect to {config.redact(url)}: {first_line(exc)}"
        raise DatabaseError(said + _connect_advice(str(exc), url)) from None
    pin(conn)
    if vector:
        # Before `migrate` the extension may not exist yet; migrate's callers reconnect after.
        with suppress(psycopg.ProgrammingError):
            register_vector(conn)
    return conn


def _connect_advice(message: str, url: str) -> str:
    """What to do about the two refusals a new role meets first (the server's English words;
    under a translated lc_messages no advice is added)."""
    if "password authentication failed" in message:
        return (
            " (check the user and password in the URL, percent-encoding @ : / ? # in them; "
            "the role's password is set by ALTER ROLE ... PASSWORD, run by a role with "
            "CREATEROLE, such as a managed service's admin)"
        )
    found = re.search(r'permission denied for database "([^"]+)"', message)
    if found:
        user = psycopg.conninfo.conninfo_to_dict(url).get("user")
        role = _ident(str(user)) if user else "the URL's role"
        return (
            f" (have the database's owner run GRANT CONNECT ON DATABASE {_ident(found[1])} "
            f"TO {role})"
        )
    return ""


def _ident(name: str) -> str:
    """`name` as SQL writes it: quoted unless plain lower case."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


def vector_name(conn: psycopg.Connection, name: str) -> sql.Identifier:
    """pgvector's object `name` (type, operator class) qualified by the extension's schema: not
    looked up through search_path, where another role's object of the same name could come
    first."""
    return sql.Identifier(_installed(vector_schema(conn)), name)


def distance_operator(conn: psycopg.Connection) -> sql.Composed:
    """pgvector's cosine distance, `OPERATOR(<its schema>.<=>)`, for the same reason."""
    return sql.SQL("OPERATOR({}.<=>)").format(sql.Identifier(_installed(vector_schema(conn))))


def vector_schema(conn: psycopg.Connection) -> str | None:
    """The schema pgvector is installed in; None where it is not installed."""
    row = conn.execute(sqlfiles.get("session", "vector_schema")).fetchone()
    return None if row is None else str(row[0])


def _installed(schema: str | None) -> str:
    if schema is None:
        raise psycopg.ProgrammingError("the vector extension is not installed")
    return schema


def register_vector(conn: psycopg.Connection) -> None:
    """pgvector's type in binary, found by the extension's schema."""
    info = TypeInfo.fetch(conn, vector_name(conn, "vector"))
    if info is None:
        raise psycopg.ProgrammingError("the vector extension has no type vector")
    register_vector_info(conn, info)


async def register_vector_async(conn: psycopg.AsyncConnection) -> None:
    """The same for an asyncio connection."""
    cur = await conn.execute(sqlfiles.get("session", "vector_schema"))
    row = await cur.fetchone()
    schema = _installed(None if row is None else str(row[0]))
    info = await TypeInfo.fetch(conn, sql.Identifier(schema, "vector"))
    if info is None:
        raise psycopg.ProgrammingError("the vector extension has no type vector")
    register_vector_info(conn, info)


def pin(conn: psycopg.Connection) -> None:
    """The settings that make keys' text canonical (sql/session.sql)."""
    conn.execute(sqlfiles.get("session", "pin"))
    if not conn.autocommit:
        conn.commit()  # a later rollback must not undo the settings


async def _pin_async(conn: psycopg.AsyncConnection) -> None:
    await conn.execute(sqlfiles.get("session", "pin"))


def _configure(conn: psycopg.Connection) -> None:
    pin(conn)
    register_vector(conn)


async def _configure_async(conn: psycopg.AsyncConnection, timeout_ms: int = 0) -> None:
    await _pin_async(conn)
    await register_vector_async(conn)
    if timeout_ms:
        await conn.execute(sqlfiles.get("session", "statement_timeout"), {"ms": str(timeout_ms)})


@contextmanager
def connection(url: str, *, autocommit: bool = True) -> Iterator[psycopg.Connection]:
    conn = connect(url, autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()


def is_local(conn: psycopg.Connection) -> bool:
    """Whether the server shares this machine's cores: a Unix socket or a loopback address."""
    if conn.info.host.startswith(("/", "@")):  # a socket directory, or Linux's abstract namespace
        return True
    try:
        return ipaddress.ip_address(conn.info.hostaddr).is_loopback
    except (ValueError, psycopg.NotSupportedError):  # no address, or a libpq before 12
        return False


def first_line(exc: BaseException | str) -> str:
    """The first non-empty line of an error (or of its detail), without libpq's repeated context.
    The server quotes a value it refuses whole (a 200,000-character key): a long quoted value
    keeps its start."""
    for line in str(exc).splitlines():
        if line.strip():
            return _QUOTE.sub(_shorten, line.strip())
    return type(exc).__name__


# Every quoted value, paired left to right: a pattern asking for long values only would pair
# the closing quote of a short one with the opening quote of the next.
_QUOTE = re.compile(r'"([^"]*)"')
_QUOTED = 60


def _shorten(value: re.Match[str]) -> str:
    return value[0] if len(value[1]) < _QUOTED + 20 else f'"{value[1][:_QUOTED]}…"'


def describe(exc: psycopg.Error) -> DatabaseError:
    """Turn a driver error into pgembed's one-line error; a privilege the role lacks says where
    each role's grants are given (PostgreSQL names the object, not the command's role), and an
    object that cannot be dropped says what depends on it (PostgreSQL puts that in the detail)."""
    if exc.sqlstate == "42501" and first_line(exc).startswith("permission denied"):
        return DatabaseError(
            f'database error: {first_line(exc)} (the README\'s "Roles" says which role '
            "runs each command and what it needs)"
        )
    detail = exc.diag.message_detail if exc.sqlstate == "2BP01" else None
    if detail:
        return DatabaseError(f"database error: {first_line(exc)} ({first_line(detail)})")
    return DatabaseError(f"database error: {first_line(exc)}")


def pool(url: str, max_size: int = defaults.POOL_MAX_SIZE) -> ConnectionPool[psycopg.Connection]:
    """A pool of autocommit connections with pgvector's types, shared by threads; not open yet.

    It keeps one connection, grows to `max_size` under load and shrinks back when idle; its
    background threads start with `open()` and end with `close()`.
    """
    return ConnectionPool(url, configure=_configure, name="pgembed", **_pool_options(max_size))


def async_pool(
    url: str, max_size: int = defaults.POOL_MAX_SIZE, *, statement_timeout: float = 0
) -> AsyncConnectionPool[psycopg.AsyncConnection]:
    """The same for asyncio: autocommit `psycopg.AsyncConnection`s with pgvector's types; opened
    (inside the event loop) with `await pool.open()`. A `statement_timeout` (seconds; 0: none)
    cancels each statement that runs longer."""
    options = _pool_options(max_size)
    configure = partial(_configure_async, timeout_ms=math.ceil(statement_timeout * 1000))
    return AsyncConnectionPool(url, configure=configure, name="pgembed-async", **options)


def check_pool_size(max_size: int) -> None:
    checks.integer("max_connections", max_size, 1)


def _pool_options(max_size: int) -> dict[str, Any]:
    """What both pools share: autocommit connections, one kept, `max_size` at most, opened later."""
    check_pool_size(max_size)
    return {
        "kwargs": _connect_options(),
        "min_size": 1,
        "max_size": max_size,
        "open": False,
        "timeout": defaults.POOL_WAIT_SECONDS,
    }


def _connect_options() -> dict[str, Any]:
    return {"autocommit": True, "application_name": APPLICATION_NAME, "connect_timeout": 10}
