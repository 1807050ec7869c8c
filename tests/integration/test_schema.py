"""The migrations build exactly the schema that pgembed/sql/schema/*.sql defines, and the
generated pgembed.search matches its snapshots in tests/integration/snapshots/.

Regenerate the snapshots after an intended change to the search compiler with
PGEMBED_UPDATE_SNAPSHOTS=1 (then review their diff).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg.rows import TupleRow

import pgembed
from helpers import database
from pgembed import db, migrate

Conn = psycopg.Connection[TupleRow]

SCHEMA_DIR = Path(pgembed.__file__).parent / "sql" / "schema"
SNAPSHOT_DIR = Path(__file__).parent / "snapshots"
UPDATE_VARIABLE = "PGEMBED_UPDATE_SNAPSHOTS"
SEARCH = "pgembed.search(text, vector, integer, jsonb)"


def schema_files() -> list[Path]:
    return sorted(SCHEMA_DIR.glob("*.sql"))


@pytest.fixture
def other_empty_db_url(server_url: str) -> Iterator[str]:
    """A second fresh database without the pgembed schema (empty_db_url gives the first)."""
    with database(server_url, "e") as url:
        yield url


# --- A normalised description of schema pgembed: object -> its definition, as text ------------

_RELATIONS = """
SELECT c.oid, c.relname, c.relkind, c.relpersistence, pg_get_userbyid(c.relowner),
       coalesce(c.reloptions::text, 'none'), c.relrowsecurity, c.relforcerowsecurity,
       c.relreplident, coalesce(c.relacl::text, 'default'),
       coalesce(obj_description(c.oid, 'pg_class'), 'none'),
       CASE WHEN c.relkind IN ('v', 'm') THEN pg_get_viewdef(c.oid, true) ELSE '' END
FROM pg_class c
WHERE c.relnamespace = 'pgembed'::regnamespace AND c.relkind NOT IN ('i', 'I', 't')
ORDER BY c.relname
"""
_PROPERTIES = (
    "persistence",
    "owner",
    "options",
    "rls",
    "force_rls",
    "replica_identity",
    "acl",
    "comment",
)

_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attidentity, a.attgenerated,
       CASE WHEN a.attcollation <> t.typcollation THEN a.attcollation::regcollation::text
            ELSE '' END,
       coalesce(col_description(a.attrelid, a.attnum), '')
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""

_SEQUENCE = """
SELECT format_type(seqtypid, NULL), seqstart, seqincrement, seqmin, seqmax, seqcache, seqcycle
FROM pg_sequence WHERE seqrelid = %s
"""

_CONSTRAINTS = """
SELECT coalesce(c.relname, format_type(k.contypid, NULL)) || '.' || k.conname,
       k.contype::text || ' ' || pg_get_constraintdef(k.oid)
       || CASE WHEN k.condeferrable THEN ' (deferrable' ELSE ' (not deferrable' END
       || CASE WHEN k.condeferred THEN ', initially deferred)' ELSE ')' END
       || coalesce(' -- ' || obj_description(k.oid, 'pg_constraint'), '')
FROM pg_constraint k
LEFT JOIN pg_class c ON c.oid = k.conrelid
WHERE k.connamespace = 'pgembed'::regnamespace
"""

_INDEXES = """
SELECT c.relname, pg_get_indexdef(c.oid)
       || coalesce(' WITH ' || c.reloptions::text, '')
       || coalesce(' -- ' || obj_description(c.oid, 'pg_class'), '')
FROM pg_class c
WHERE c.relnamespace = 'pgembed'::regnamespace AND c.relkind IN ('i', 'I')
"""

# Aggregates have no pg_get_functiondef; pgembed has none, but say so rather than fail.
_FUNCTIONS = """
SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
       CASE WHEN p.prokind = 'a' THEN 'aggregate' ELSE pg_get_functiondef(p.oid) END
       || E'-- owner: ' || pg_get_userbyid(p.proowner)
       || E'\n-- acl: ' || coalesce(p.proacl::text, 'default')
       || E'\n-- comment: ' || coalesce(obj_description(p.oid, 'pg_proc'), '')
FROM pg_proc p
WHERE p.pronamespace = 'pgembed'::regnamespace
"""

# Internal triggers (those of foreign keys) are part of their constraint.
_TRIGGERS = """
SELECT c.relname || '.' || t.tgname,
       pg_get_triggerdef(t.oid) || ' -- enabled: ' || t.tgenabled::text
       || coalesce(' -- ' || obj_description(t.oid, 'pg_trigger'), '')
FROM pg_trigger t
JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'pgembed'::regnamespace AND NOT t.tgisinternal
"""

_POLICIES = """
SELECT tablename || '.' || policyname,
       concat_ws(' ', permissive, roles::text, cmd, 'USING', qual, 'WITH CHECK', with_check)
FROM pg_policies WHERE schemaname = 'pgembed'
"""

# Types of their own (not the row types of tables, nor array types).
_TYPES = """
SELECT t.typname,
       t.typtype::text || ' ' || format_type(t.typbasetype, t.typtypmod)
       || ' not null ' || t.typnotnull || ' default ' || coalesce(t.typdefault, '')
       || ' labels ' || coalesce((SELECT string_agg(e.enumlabel, ', ' ORDER BY e.enumsortorder)
                                  FROM pg_enum e WHERE e.enumtypid = t.oid), '')
FROM pg_type t
LEFT JOIN pg_class c ON c.oid = t.typrelid
WHERE t.typnamespace = 'pgembed'::regnamespace AND t.typcategory <> 'A'
  AND (t.typrelid = 0 OR c.relkind = 'c')
"""

_SCHEMAS = """
SELECT n.nspname,
       pg_get_userbyid(n.nspowner) || ' acl ' || coalesce(n.nspacl::text, 'default')
       || ' -- ' || coalesce(obj_description(n.oid, 'pg_namespace'), '')
FROM pg_namespace n
WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
"""

_EXTENSIONS = """
SELECT e.extname, 'schema ' || n.nspname || ' version ' || e.extversion
FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
"""


def _pairs(conn: Conn, query: str, kind: str) -> dict[str, str]:
    return {f"{kind}{name}": text for name, text in conn.execute(query.encode()).fetchall()}


def _relations(conn: Conn) -> dict[str, str]:
    found = {}
    for oid, name, kind, *properties, viewdef in conn.execute(_RELATIONS.encode()).fetchall():
        header = [f"relkind {kind}"]
        header += [f"{label} {value}" for label, value in zip(_PROPERTIES, properties, strict=True)]
        lines = [", ".join(header)]
        for column in conn.execute(_COLUMNS.encode(), (oid,)).fetchall():
            attname, typ, notnull, default, identity, generated, collation, comment = column
            lines.append(
                " ".join(
                    part
                    for part in (
                        f"    {attname} {typ}",
                        "NOT NULL" if notnull else "",
                        f"DEFAULT {default}" if default else "",
                        f"IDENTITY {identity}" if identity else "",
                        f"GENERATED {generated}" if generated else "",
                        f"COLLATE {collation}" if collation else "",
                        f"-- {comment}" if comment else "",
                    )
                    if part
                )
            )
        if kind == "S":
            lines.append(f"    sequence {conn.execute(_SEQUENCE.encode(), (oid,)).fetchone()}")
        if viewdef:
            lines.append(f"    AS {viewdef}")
        found[f"relation pgembed.{name}"] = "\n".join(lines) + "\n"
    return found


def describe(conn: Conn) -> dict[str, str]:
    """Every object of schema pgembed (and the database's schemas and extensions), by name."""
    return {
        **_pairs(conn, _SCHEMAS, "schema "),
        **_pairs(conn, _EXTENSIONS, "extension "),
        **_relations(conn),
        **_pairs(conn, _CONSTRAINTS, "constraint pgembed."),
        **_pairs(conn, _INDEXES, "index pgembed."),
        **_pairs(conn, _FUNCTIONS, "function pgembed."),
        **_pairs(conn, _TRIGGERS, "trigger pgembed."),
        **_pairs(conn, _POLICIES, "policy pgembed."),
        **_pairs(conn, _TYPES, "type pgembed."),
    }


def differences(migrated: dict[str, str], reference: dict[str, str]) -> list[str]:
    """One readable entry per object missing from one side or defined differently."""
    found = []
    for key in sorted(migrated.keys() | reference.keys()):
        if key not in reference:
            found.append(f"{key}: made by the migrations, missing from sql/schema/")
        elif key not in migrated:
            found.append(f"{key}: defined in sql/schema/, not made by the migrations")
        elif migrated[key] != reference[key]:
            diff = difflib.unified_diff(
                reference[key].splitlines(keepends=True),
                migrated[key].splitlines(keepends=True),
                fromfile=f"sql/schema/: {key}",
                tofile=f"migrations: {key}",
            )
            found.append("".join(diff))
    return found


def test_migrations_yield_the_current_schema(empty_db_url: str, other_empty_db_url: str) -> None:
    with db.connection(empty_db_url) as conn:
        migrate.migrate(conn)
        applied = conn.execute("SELECT version FROM pgembed.migrations ORDER BY 1").fetchall()
        assert [v for (v,) in applied] == [m.version for m in migrate.available()]
        migrated = describe(conn)
    files = schema_files()
    assert files, f"no schema files in {SCHEMA_DIR}"
    # As a reader would run them with psql: the role's own search_path, where the extension goes.
    with psycopg.connect(other_empty_db_url, autocommit=True) as conn:
        for path in files:
            with conn.transaction():
                conn.execute(path.read_bytes())
        reference = describe(conn)
    for description in (migrated, reference):
        assert "extension vector" in description
        assert "function pgembed.search(model text, query vector, k integer, filter jsonb)" in (
            description
        )
    problems = differences(migrated, reference)
    if problems:
        pytest.fail(
            f"{len(problems)} object(s) differ between the migrations and pgembed/sql/schema/ "
            "(- sql/schema, + migrations):\n\n" + "\n".join(problems),
            pytrace=False,
        )


# --- The generated pgembed.search, compared with its snapshots --------------------------------

SAMPLE_MODEL = """
INSERT INTO pgembed.models (
    name, table_schema, table_name, key_column, key_type, text_column, text_columns,
    embedding_column, model_ref, pooling, normalize, dimensions, max_seq_length)
VALUES ('sample', 'public', 'docs', 'id', 'integer', 'body', '{body}', 'embedding_sample',
        'sentence-transformers/all-MiniLM-L6-v2', 'mean', true, 3, 256)
"""


def generated_search(conn: Conn) -> str:
    row = conn.execute("SELECT pg_get_functiondef(%s::regprocedure)", (SEARCH,)).fetchone()
    assert row is not None
    return str(row[0])


def snapshot_mismatch(name: str, what: str, generated: str) -> str | None:
    """None when snapshots/<name> holds `generated` (or was just rewritten to); else a diff."""
    path = SNAPSHOT_DIR / name
    text = (
        f"-- {what}: pg_get_functiondef of {SEARCH}.\n"
        f"-- Written by tests/integration/test_schema.py with {UPDATE_VARIABLE}=1; do not edit.\n"
        f"{generated}"
    )
    if os.environ.get(UPDATE_VARIABLE) == "1":
        SNAPSHOT_DIR.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return None
    stored = path.read_text(encoding="utf-8") if path.exists() else ""
    if stored == text:
        return None
    diff = difflib.unified_diff(
        stored.splitlines(keepends=True),
        text.splitlines(keepends=True),
        fromfile=f"tests/integration/snapshots/{name}",
        tofile="generated",
    )
    return f"{what} differs from {path.name}:\n" + "".join(diff)


def test_generated_search_matches_the_snapshot(db_url: str) -> None:
    with db.connection(db_url) as conn:
        empty = generated_search(conn)
        conn.execute(
            "CREATE TABLE docs (id integer PRIMARY KEY, body text, embedding_sample vector(3))"
        )
        conn.execute(
            "INSERT INTO docs VALUES (1, 'one', '[1,0,0]'), (2, 'two', '[0,1,0]'), "
            "(3, 'three', '[0.9,0.1,0]')"
        )
        # Autocommit: the deferred recompile_search trigger rebuilds the function at the commit.
        conn.execute(SAMPLE_MODEL.encode())
        sample = generated_search(conn)
        # The generated branch runs, nearest first.
        hits = conn.execute("SELECT key FROM pgembed.search('sample', '[1,0,0]', 2)").fetchall()
        assert hits == [("1",), ("3",)]
    assert "WHEN 'sample' THEN" in sample and "WHEN NULL THEN NULL;" in empty
    problems = [
        problem
        for problem in (
            snapshot_mismatch("search_empty.sql", "pgembed.search with no model", empty),
            snapshot_mismatch(
                "search_sample.sql", "pgembed.search with one model, 'sample' (3 dims)", sample
            ),
        )
        if problem
    ]
    if problems:
        pytest.fail(
            "\n".join(problems) + f"\nIf the change is intended, regenerate the snapshots with "
            f"{UPDATE_VARIABLE}=1 .venv/bin/python -m pytest tests/integration/test_schema.py "
            "and review their diff.",
            pytrace=False,
        )
