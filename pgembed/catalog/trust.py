"""Whose rights a watched table's own code runs with when pgembed's daemon writes to it, and
whether the daemon may read it whole.

A table's owner can attach code to it (triggers, rules, policies, check constraints, index
expressions); PostgreSQL runs that code as whoever writes the table. The daemon writes every
watched table's vectors, so written as the daemon, one owner's trigger would run with the
daemon's grants on every other watched table (or a syncing superuser's powers). So the daemon
writes a table as its owner, as PostgreSQL's own maintenance commands and logical replication
do: through a SECURITY DEFINER function owned by the table's owner (sql/definitions/40_sync.sql),
inside which PostgreSQL refuses SET ROLE, so the owner's code cannot step back into the daemon's
role. That needs the daemon to be able to SET ROLE to the owner: a superuser, or GRANT owner TO
the daemon's role WITH INHERIT FALSE. A table whose owner is a superuser, the daemon's login
itself, or a role that may already act as the daemon's role and session user (SET ROLE to each,
or an ADMIN option on it that PostgreSQL 16+ gives the role that created it, held by the owner or
a role it may SET ROLE to: a managed service's admin role that made the daemon's login) is written
directly: its code gains nothing it does not have; the session is put right after it all the same.

Row-level security that filters the daemon's reads would make rows it cannot see look deleted;
such a table is not synced (its keys stay queued) until the daemon's role may read every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from pgembed import sqlfiles
from pgembed.catalog import tables
from pgembed.catalog.registry import ModelSpec


@dataclass(frozen=True)
class TableTrust:
    owner: str
    owner_is_superuser: bool
    session_is_owner: bool  # the daemon logged in as the table's owner
    can_become_owner: bool  # SET ROLE to the owner is allowed (a superuser, or a member)
    owner_can_become_role: bool  # the owner may act as this role already (SET, or ADMIN option)
    owner_has_temp: bool  # the owner may create temporary objects (its writing function is one)
    role_has_temp: bool  # so may this role: the function is made in this session's temp schema
    row_security: bool  # row-level security filters what this role reads of the table
    role: str  # this role (CURRENT_USER)
    schema_usable: bool  # this role may look names up in the table's schema
    key_schema_unusable: str | None  # the schema of the key's type, when this role may not
    may_update_vector: bool  # this role may UPDATE the model's vector column (a direct write)

    @property
    def runs_foreign_code(self) -> bool:
        """Whether a write runs code of a role that is neither a superuser nor this session's
        (as the owner, or directly for an owner that may act as this role): the session is put
        right after it."""
        return not (self.owner_is_superuser or self.session_is_owner)

    @property
    def writes_as_owner(self) -> bool:
        """Whether vectors are written through a function owned by the table's owner."""
        return not (self.owner_is_superuser or self.session_is_owner or self.owner_can_become_role)


def inspect(conn: psycopg.Connection, spec: ModelSpec) -> TableTrust | None:
    """The table's trust facts for this role; None when the table is gone."""
    row = conn.execute(
        sqlfiles.get("catalog", "table_trust"),
        {
            "schema": spec.table_schema,
            "name": spec.table_name,
            "key": spec.key_column,
            "vector": spec.embedding_column,
        },
    ).fetchone()
    return None if row is None else TableTrust(*row)


def broken(conn: psycopg.Connection, spec: ModelSpec) -> str | None:
    """Why the model cannot be synced: its table, columns or chunk names (tables.model_problem),
    a reindex's switch that would fail (tables.switch_problem), or this role's rights on the
    table (problem below); else None. The daemon skips such a model, `status` marks it broken
    and a reindex's or backfill's own fill stops, each saying this one line."""
    return (
        tables.model_problem(conn, spec) or tables.switch_problem(conn, spec) or problem(conn, spec)
    )


def problem(conn: psycopg.Connection, spec: ModelSpec) -> str | None:
    """Why this role cannot sync the model's table safely and whole, with what to do; else None.

    The daemon skips such a model (its keys stay queued) and `status` says this one line."""
    found = inspect(conn, spec)
    if found is None:
        return None  # tables.problem says the table is gone
    table = spec.qualified_table
    if not found.schema_usable:
        schema = sql.Identifier(spec.table_schema).as_string(conn)  # a GRANT to paste
        return (
            f"role {found.role} may not use schema {spec.table_schema}, which holds {table}: "
            f"its keys stay queued (GRANT USAGE ON SCHEMA {schema} TO pgembed_daemon, run by the "
            "schema's owner; `model add` and `migrate` do it when their role may)"
        )
    if found.key_schema_unusable is not None:
        schema = sql.Identifier(found.key_schema_unusable).as_string(conn)
        return (
            f"role {found.role} may not use schema {found.key_schema_unusable}, which holds the "
            f"type of {table}'s key column {spec.key_column}: its keys stay queued (GRANT USAGE "
            f"ON SCHEMA {schema} TO pgembed_daemon, run by the schema's owner; `model add` and "
            "`migrate` do it when their role may)"
        )
    if found.row_security:
        return (
            f"row-level security on {table} hides rows from role {found.role}, so they would "
            f"look deleted: its keys stay queued until {found.role} may read every row "
            f"(ALTER ROLE {found.role} BYPASSRLS, run by a superuser, or on PostgreSQL 16+ by a "
            "role with CREATEROLE and BYPASSRLS itself and the ADMIN option on "
            f"{found.role}; or sync as the table's owner {found.owner} without FORCE ROW LEVEL "
            "SECURITY)"
        )
    if not found.writes_as_owner:
        if found.may_update_vector:
            return None
        column = sql.Identifier(spec.embedding_column).as_string(conn)
        return (
            f"role {found.role} may not update {table}.{spec.embedding_column}: its keys stay "
            f"queued (GRANT UPDATE ({column}) ON {table} TO pgembed_daemon, run by the table's "
            f"owner {found.owner}; `model add` and `migrate` do it when their role may)"
        )
    if not found.can_become_owner:
        return (
            f"{table} belongs to {found.owner}, and role {found.role} may not act as it: the "
            "daemon writes a table's vectors as its owner, so the owner's triggers run with the "
            f"owner's rights only (GRANT {found.owner} TO {found.role} WITH INHERIT FALSE, run "
            f"by a role with the ADMIN option on {found.owner}, such as the role that created "
            "it)"
        )
    if not found.owner_has_temp:
        return (
            f"{table} belongs to {found.owner}, which may not create temporary objects in this "
            "database: the daemon writes its vectors through a temporary function of that "
            f"owner (GRANT TEMPORARY ON DATABASE ... TO {found.owner}, in this database, run by "
            "its owner)"
        )
    if not found.role_has_temp:
        return (
            f"{table} belongs to {found.owner}, and role {found.role} may not create temporary "
            "objects in this database: the daemon writes its vectors through a temporary "
            f"function it makes for that owner (GRANT TEMPORARY ON DATABASE ... TO {found.role}, "
            "in this database, run by its owner)"
        )
    return None
