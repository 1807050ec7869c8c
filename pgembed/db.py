"""Connections: URL resolution, pgvector's binary types, and errors a user can read."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psycopg
from pgvector.psycopg import register_vector

from pgembed import config, embedded
from pgembed.errors import ConfigError, DatabaseError

APPLICATION_NAME = "pgembed"


def resolve_url(explicit: str | None = None) -> str:
    """The URL from option or environment, else the embedded server's (started on demand)."""
    return config.database_url(explicit) or embedded.url()


def connect(url: str, *, autocommit: bool = True, vector: bool = True) -> psycopg.Connection:
    """Open a connection; with `vector`, pgvector's types travel in binary."""
    try:
        conn = psycopg.connect(
            url, autocommit=autocommit, application_name=APPLICATION_NAME, connect_timeout=10
        )
    except psycopg.ProgrammingError as exc:
        raise ConfigError(f"malformed database URL {config.redact(url)!r}: {exc}") from None
    except psycopg.OperationalError as exc:
        raise DatabaseError(f"cannot connect to {config.redact(url)}: {first_line(exc)}") from None
    if vector:
        # Before `migrate` the extension may not exist yet; migrate's callers reconnect after.
        with suppress(psycopg.ProgrammingError):
            register_vector(conn)
    return conn


@contextmanager
def connection(url: str, *, autocommit: bool = True) -> Iterator[psycopg.Connection]:
    conn = connect(url, autocommit=autocommit)
    try:
        yield conn
    finally:
        conn.close()


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an error, without libpq's repeated context."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def describe(exc: psycopg.Error) -> DatabaseError:
    """Turn a driver error into pgembed's one-line error."""
    return DatabaseError(f"database error: {first_line(exc)}")


class Pool:
    """A few autocommit connections reused across calls and threads; no background threads.

    Each caller gets a connection of its own; one left broken or inside a transaction is closed.
    """

    def __init__(self, url: str, max_idle: int = 4) -> None:
        self.url = url
        self._max_idle = max_idle
        self._idle: list[psycopg.Connection] = []
        self._lock = threading.Lock()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed:
            conn = connect(self.url)
        try:
            yield conn
        finally:
            self._give_back(conn)

    def _give_back(self, conn: psycopg.Connection) -> None:
        idle = psycopg.pq.TransactionStatus.IDLE
        if not conn.closed and conn.info.transaction_status == idle:
            with self._lock:
                if len(self._idle) < self._max_idle:
                    self._idle.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
