"""`pgembed migrate`: the run-once migrations (migrations/*.sql: tables, columns, data moves,
drops), applied in order, once, checksummed; then the definitions (sql/definitions/*.sql: every
function, trigger and grant, defined once), re-applied whenever one changed. All under an advisory
lock, with a pinned search_path."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from pgembed import db, roles, sqlfiles
from pgembed.errors import DatabaseError, SchemaError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
DEFINITIONS_DIR = Path(__file__).parent / "sql" / "definitions"
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Any constant works; this one is "pgembed" in ASCII, so it is easy to spot in pg_locks.
_LOCK_KEY = 0x7067656D626564


def _sha256(text: str) -> str:
    """What pgembed.migrations and pgembed.definitions record of a file, to see it changed."""
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def sha256(self) -> str:
        return _sha256(self.sql)

    @property
    def filename(self) -> str:
        return f"{self.version:04d}_{self.name}.sql"


@dataclass(frozen=True)
class Definition:
    """One file of sql/definitions/: statements that are safe to run again (CREATE OR REPLACE)."""

    file: str
    sql: str

    @property
    def filename(self) -> str:
        return f"definitions/{self.file}"

    @property
    def sha256(self) -> str:
        return _sha256(self.sql)


def available(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if match:
            found.append(Migration(int(match[1]), match[2], path.read_text(encoding="utf-8")))
    return found


def definitions(directory: Path = DEFINITIONS_DIR) -> list[Definition]:
    """The definition files, in the order they are applied (by name)."""
    return [
        Definition(path.name, path.read_text(encoding="utf-8"))
        for path in sorted(directory.glob("*.sql"))
    ]


def applied(conn: psycopg.Connection) -> dict[int, str]:
    """version -> sha256 of what was applied; empty when pgembed was never installed."""
    exists = conn.execute(sqlfiles.get("migrate", "installed")).fetchone()
    if not exists or not exists[0]:
        return {}
    rows = conn.execute(sqlfiles.get("migrate", "applied")).fetchall()
    return {version: sha for version, sha in rows}


def migrate(
    conn: psycopg.Connection,
    directory: Path = MIGRATIONS_DIR,
    *,
    create_roles: bool = False,
    definitions_dir: Path | None = None,
    on_define: Callable[[Definition], None] | None = None,
) -> list[Migration]:
    """Apply every pending migration, each in its own transaction, and return them; then the
    definitions if any changed (or a migration was applied), in one transaction, each file
    passed to `on_define` once it is committed.
    The definitions are the package's with its own migrations, else `definitions_dir`. The
    roles of least privilege are made with `create_roles`, and their grants kept current."""
    definitions_dir = _definitions_beside(directory, definitions_dir)
    _require_vector_available(conn)
    conn.execute(sqlfiles.get("migrate", "lock"), {"key": _LOCK_KEY})
    try:
        schema = _vector_schema(conn)
        _refuse_shadows(conn, schema)
        with conn.transaction():
            conn.execute(sqlfiles.get("migrate", "bootstrap"))
        done = applied(conn)
        migrations = available(directory)
        _refuse_tampered(done, migrations)
        pending = [m for m in migrations if m.version not in done]
        _apply(conn, schema, pending)
        if definitions_dir is not None:
            _refuse_newer(done, migrations)
            wanted = definitions(definitions_dir)
            for definition in _define(conn, schema, wanted, force=bool(pending)):
                if on_define is not None:
                    on_define(definition)
        if create_roles:
            roles.create(conn)
        elif directory == MIGRATIONS_DIR:  # the grants read the current catalog
            roles.grant(conn)
        return pending
    except psycopg.errors.InsufficientPrivilege as exc:
        raise DatabaseError(f"migration failed: {db.first_line(exc)}: {_who_may(conn)}") from None
    except psycopg.Error as exc:
        raise DatabaseError(f"migration failed: {exc}") from None
    finally:
        conn.execute(sqlfiles.get("migrate", "unlock"), {"key": _LOCK_KEY})


def _apply(conn: psycopg.Connection, schema: str, pending: list[Migration]) -> None:
    """Each migration in its own transaction, recorded with its sha256 in the same one."""
    for migration in pending:
        with conn.transaction():
            conn.execute(sqlfiles.get("migrate", "pin"), {"schema": schema})
            conn.execute(migration.sql.encode())
            record = {"version": migration.version, "name": migration.name}
            conn.execute(sqlfiles.get("migrate", "record"), {**record, "sha256": migration.sha256})


def _definitions_beside(directory: Path, given: Path | None) -> Path | None:
    """The definitions that go with these migrations: the package's with its own migrations (a
    copy of older ones would lack the tables the definitions read), else only those given."""
    if given is None and directory == MIGRATIONS_DIR:
        return DEFINITIONS_DIR
    return given


def _define(
    conn: psycopg.Connection, schema: str, wanted: list[Definition], *, force: bool
) -> list[Definition]:
    """Every definition file again, in one transaction, when one differs from what was applied
    (or `force`: a migration may have dropped what they define); [] when all are current."""
    if not force and _defined(conn) == {d.file: d.sha256 for d in wanted}:
        return []
    with conn.transaction():
        conn.execute(sqlfiles.get("migrate", "pin"), {"schema": schema})
        for definition in wanted:
            conn.execute(definition.sql.encode())
        conn.execute(sqlfiles.get("migrate", "forget_definitions"))
        for definition in wanted:
            record = {"file": definition.file, "sha256": definition.sha256}
            conn.execute(sqlfiles.get("migrate", "record_definition"), record)
    return wanted


def _defined(conn: psycopg.Connection) -> dict[str, str] | None:
    """file -> sha256 of the definitions as last applied; None where that cannot be told (before
    migration 0013, or for a role that may not read the record)."""
    readable = conn.execute(sqlfiles.get("migrate", "definitions_readable")).fetchone()
    if not readable or not readable[0]:
        return None
    return dict(conn.execute(sqlfiles.get("migrate", "defined")).fetchall())


def require_current(
    conn: psycopg.Connection,
    directory: Path = MIGRATIONS_DIR,
    definitions_dir: Path | None = None,
) -> None:
    """Raise a SchemaError that says to run `pgembed migrate` unless the schema is current: every
    migration applied, and the definitions (the package's with its own migrations) as they are
    in their files."""
    done = applied(conn)
    wanted = available(directory)
    if not done:
        raise SchemaError("the pgembed schema is not installed: run `pgembed migrate`")
    _refuse_tampered(done, wanted)
    missing = [m.filename for m in wanted if m.version not in done]
    if missing:
        raise SchemaError(
            f"the pgembed schema is behind ({len(missing)} pending migration(s), first "
            f"{missing[0]}): run `pgembed migrate`"
        )
    definitions_dir = _definitions_beside(directory, definitions_dir)
    if definitions_dir is None or _newer(done, wanted):
        return  # an older pgembed works on a newer schema, as with the migrations alone
    defined = _defined(conn)
    if defined is None:  # a reader with the grants of older releases: nothing to check against
        return
    stale = [d.file for d in definitions(definitions_dir) if defined.get(d.file) != d.sha256]
    if stale:
        raise SchemaError(
            f"the pgembed functions are behind this pgembed ({', '.join(stale)} changed): "
            "run `pgembed migrate`"
        )


def _newer(done: dict[int, str], wanted: list[Migration]) -> list[int]:
    """Migrations the database has and this pgembed does not know: a newer pgembed ran."""
    return sorted(set(done) - {m.version for m in wanted})


def _refuse_newer(done: dict[int, str], wanted: list[Migration]) -> None:
    """An older pgembed must not put its definitions over a newer one's."""
    newer = _newer(done, wanted)
    if newer:
        raise SchemaError(
            f"this database was migrated by a newer pgembed (migration {newer[-1]:04d}, which this "
            "one does not have): upgrade pgembed to migrate it"
        )


def _refuse_tampered(done: dict[int, str], wanted: list[Migration]) -> None:
    for migration in wanted:
        sha = done.get(migration.version)
        if sha is not None and sha != migration.sha256:
            raise SchemaError(
                f"migration {migration.filename} changed after it was applied "
                f"(applied sha256 {sha[:12]}, file {migration.sha256[:12]}); "
                "refusing to continue: restore the file or add a new migration"
            )


def _vector_schema(conn: psycopg.Connection) -> str:
    """pgvector's schema, installing it first where the role's own search_path says (public,
    usually): migrations then run with search_path = pg_catalog, that schema, pg_temp."""
    schema = db.vector_schema(conn)
    if schema is None:
        try:
            with conn.transaction():
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.errors.InsufficientPrivilege:
            raise DatabaseError(_who_creates_vector(conn)) from None
        schema = db.vector_schema(conn)
    assert schema is not None
    where = conn.execute(sqlfiles.get("migrate", "vector_usable"), {"schema": schema}).fetchone()
    if where is not None and not where[0]:
        raise DatabaseError(
            f"pgvector is installed in schema {where[1]}, which role {where[2]} may not use: "
            f"have its owner run `GRANT USAGE ON SCHEMA {where[1]} TO {where[2]};`, "
            "then run `pgembed migrate` again"
        )
    return schema


def _who_creates_vector(conn: psycopg.Connection) -> str:
    """Who must create pgvector, which only a superuser may (it is not a trusted extension), and
    what managed services call that step; one line."""
    row = conn.execute(sqlfiles.get("migrate", "whoami")).fetchone()
    database, role = row if row else ("this database", "this role")
    return (
        f"the vector extension is not installed in database {database}, and role {role} may not "
        f"create it (pgvector needs a superuser): have a superuser run `CREATE EXTENSION vector;` "
        f"in database {database} (on Amazon RDS or Cloud SQL the admin role may; Azure Database "
        "for PostgreSQL first needs vector in its azure.extensions server parameter; Supabase: "
        "enable vector under Database, Extensions; Neon: run it in the SQL Editor), then run "
        "`pgembed migrate` again"
    )


def _refuse_shadows(conn: psycopg.Connection, schema: str) -> None:
    """Refuse to run as this role while pgvector's schema holds functions or operators that
    could take over built-in calls (some SQL of migrations already applied elsewhere cannot be
    changed to qualify every name)."""
    found = [row[0] for row in conn.execute(sqlfiles.get("migrate", "shadows"), {"schema": schema})]
    if found:
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        raise SchemaError(
            f"refusing to migrate: schema {schema} (pgvector's) holds {shown}, named like "
            "built-ins and part of no extension, which could run as you: drop them, or keep "
            f"other roles from creating there (REVOKE CREATE ON SCHEMA {schema} FROM PUBLIC)"
        )


MIN_SERVER_VERSION = 160000  # pg_has_role(..., 'SET'), pg_input_is_valid, GRANT ... INHERIT FALSE


def _who_may(conn: psycopg.Connection) -> str:
    """What to do when this role may not migrate: migrate as the role that owns schema pgembed,
    or, before there is one, as the database's owner or after it grants CREATE."""
    row = conn.execute(sqlfiles.get("migrate", "schema_owner")).fetchone()
    if row is None:
        return "run `pgembed migrate` as the role that owns schema pgembed"
    owner, installed, database, role = row
    if owner == role:  # it owns what it migrates: what it lacks is the privilege named before
        return (
            f"{role} owns schema pgembed; give it that privilege or migrate as a role that has "
            "it (--create-roles needs CREATEROLE)"
        )
    if installed:
        return f"run `pgembed migrate` as {owner}, the owner of schema pgembed (or a member of it)"
    return (
        f"run `pgembed migrate` as {owner}, the owner of database {database}, or have it run "
        f"GRANT CREATE ON DATABASE {database} TO {role}"
    )


def _require_vector_available(conn: psycopg.Connection) -> None:
    if conn.info.server_version < MIN_SERVER_VERSION:
        raise DatabaseError(
            f"pgembed needs PostgreSQL 16 or later; this server is {conn.info.server_version}: "
            "its SQL uses pg_input_is_valid and role membership options that came in 16"
        )
    row = conn.execute(sqlfiles.get("migrate", "vector_available")).fetchone()
    if not row or not row[0]:
        raise DatabaseError(
            "the server has no `vector` extension available: install pgvector "
            "(https://github.com/pgvector/pgvector) or use an image such as pgvector/pgvector"
        )
