"""Roles of least privilege: `pgembed migrate --create-roles` makes two NOLOGIN group roles,
pgembed_daemon (the sync daemon, status) and pgembed_reader (searches), and keeps their grants
current; `model add` lets the daemon role read a watched table's key and text and write its
vector column. Application writers need nothing (see sql/roles.sql)."""

from __future__ import annotations

import psycopg
from psycopg import sql

from pgembed import sqlfiles
from pgembed.catalog import naming, registry, tables
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
    a new table gets its grants too), and the daemon its columns of every model's table (models
    added before the roles were made included)."""
    with conn.transaction():
        for role, block in ((DAEMON, "grant_daemon"), (READER, "grant_reader")):
            if _exists(conn, role):
                for statement in sqlfiles.statements("roles", block):
                    conn.execute(statement)
        for spec in registry.all_models(conn):
            if tables.model_problem(conn, spec) is None:
                grant_table(conn, spec)


def grant_table(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """The daemon role reads the key and text and writes the vector of a model's table (and
    looks it up in its schema, and its key's type in that type's, when this role may grant
    that); with a chunk table, the daemon writes it and the reader reads it."""
    if _exists(conn, DAEMON):
        key = conn.execute(
            "SELECT pgembed._key_schema_v1(%s, %s, %s)",
            (spec.table_schema, spec.table_name, spec.key_column),
        ).fetchone()
        key_schema = key[0] if key else None
        for schema in dict.fromkeys(s for s in (spec.table_schema, key_schema) if s is not None):
            grantable = conn.execute(
                sqlfiles.get("roles", "schema_grantable"), {"schema": schema}
            ).fetchone()
            if grantable == (True,):
                conn.execute(
                    sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                        sql.Identifier(schema), sql.Identifier(DAEMON)
                    )
                )
        readable = sql.SQL(", ").join(sql.Identifier(c) for c in spec.columns)
        conn.execute(
            sql.SQL("GRANT SELECT ({}), UPDATE ({}) ON {} TO {}").format(
                readable,
                sql.Identifier(spec.embedding_column),
                naming.table(spec),
                sql.Identifier(DAEMON),
            )
        )
    if not spec.chunked:
        return
    chunks = naming.chunk_table(spec)
    grants = [(DAEMON, "SELECT, INSERT, DELETE"), (READER, "SELECT")]
    for role, privileges in grants:
        if _exists(conn, role):
            conn.execute(
                sql.SQL("GRANT {} ON {} TO {}").format(
                    sql.SQL(privileges), chunks, sql.Identifier(role)
                )
            )


def revoke_table(conn: psycopg.Connection, spec: ModelSpec) -> None:
    """The model goes: the daemon keeps only what the table's other models need. Its privileges
    go by the columns it holds them on now, not by the model's names, so a text column renamed
    since does not keep them (a column already gone took its own along); but while another
    model of the table is broken, a column of a name no model knows may be that model's,
    renamed: only the removed model's own names are revoked then."""
    if not _exists(conn, DAEMON):
        return
    where = {"schema": spec.table_schema, "name": spec.table_name}
    held = [row[0] for row in conn.execute(sqlfiles.get("roles", "daemon_columns"), where)]
    others = [
        other
        for other in registry.all_models(conn)
        if (other.table_schema, other.table_name) == (spec.table_schema, spec.table_name)
        and other.name != spec.name
    ]
    needed = {column for other in others for column in other.columns}
    if any(tables.model_problem(conn, other) is not None for other in others):
        held = [column for column in held if column in spec.columns]
    revoked = [column for column in held if column not in needed]
    if revoked:
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in revoked)
        conn.execute(
            sql.SQL("REVOKE SELECT ({0}), UPDATE ({0}) ON {1} FROM {2}").format(
                columns, naming.table(spec), sql.Identifier(DAEMON)
            )
        )


def _exists(conn: psycopg.Connection, role: str) -> bool:
    return conn.execute(sqlfiles.get("roles", "exists"), {"role": role}).fetchone() == (True,)
