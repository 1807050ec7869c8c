"""A normalised description of schema pgembed, object by object, to compare two databases'
pgembed objects (tests/integration/test_schema.py, test_upgrade.py)."""

from __future__ import annotations

import psycopg
from psycopg.rows import TupleRow

Conn = psycopg.Connection[TupleRow]

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
