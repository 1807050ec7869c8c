"""Database roles for trust tests: sessions as a role, and throwaway roles dropped after use
(roles are cluster-wide, so each gets a random suffix)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from psycopg import sql

from pgembed import db


def as_role(url: str, role: str) -> str:
    """`url` whose sessions run as `role` (SET ROLE at connection start)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-c role={role}"))
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


def with_user(url: str, user: str) -> str:
    """`url` logged in as `user` itself (its session user), not SET ROLE as `as_role` does."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


@contextmanager
def role_maker(url: str) -> Iterator[Callable[..., str]]:
    """make(prefix, *options) -> a new NOLOGIN role's name; each is dropped after, with what
    it owns in `url`'s database."""
    made: list[str] = []

    def make(prefix: str, *options: str) -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        with db.connection(url) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} NOLOGIN {}").format(
                    sql.Identifier(name), sql.SQL(" ".join(options))
                )
            )
        made.append(name)
        return name

    try:
        yield make
    finally:
        with db.connection(url) as conn:
            for name in reversed(made):
                conn.execute(sql.SQL("DROP OWNED BY {} CASCADE").format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))
