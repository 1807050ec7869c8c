"""Roles of least privilege: `pgembed migrate --create-roles` makes two NOLOGIN group roles,
pgembed_daemon (the sync daemon) and pgembed_reader (searches, status), and keeps their grants
current; `model add` lets the daemon role read a watched table's key and text and write its
vector column. Application writers need nothing (see sql/roles.sql)."""

from __future__ import annotations

import psycopg
from psycopg import sql

from pgembed import sqlfiles
from pgembed.catalog import naming
from pgembed.catalog.registry import ModelSpec

DAEMON = "pgembed_daemon"
READER = "pgembed_reader"


def create(conn: psycopg.Connection) -> None:
    """Create the two roles (if missing) and grant them pgembed's tables."""
    with conn.transaction():
        conn.execute(sqlfiles.get("roles", "create"))
    grant(conn)


def grant(conn: psycopg.Connection) -> None:
    """Grant each role that exists what it needs on schema pgembed (again after a migration:
    a new table gets its grants too)."""
    with conn.transaction():
        for role, block in ((DAEMON, "grant_daemon"), (READER, "grant_reader")):
            if _exists(conn, role):
                for statement in sqlfiles.statements("roles", block):
                    conn.execute(statement)


def grant_table(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """The daemon role reads the key and text and writes the vector of a model's table."""
    if not _exists(conn, DAEMON):
        return
    readable = sql.SQL(", ").join(
        sql.Identifier(c) for c in (spec.key_column, *spec.text_columns, spec.embedding_column)
    )
    vector = sql.Identifier(spec.embedding_column)
    conn.execute(
        sql.SQL("GRANT SELECT ({}), UPDATE ({}) ON {} TO {}").format(
            readable, vector, naming.table(spec), sql.Identifier(DAEMON)
        )
    )


def _exists(conn: psycopg.Connection, role: str) -> bool:
    return conn.execute(sqlfiles.get("roles", "exists"), {"role": role}).fetchone() == (True,)
