-- Static statements of `pgembed migrate`. Loaded by pgembed.sqlfiles.

-- name: bootstrap
-- The schema and the record of applied migrations, before the first migration runs.
CREATE SCHEMA IF NOT EXISTS pgembed;
CREATE TABLE IF NOT EXISTS pgembed.migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);

-- name: installed
SELECT pg_catalog.to_regclass('pgembed.migrations') IS NOT NULL;

-- name: applied
SELECT version, sha256 FROM pgembed.migrations;

-- name: record
INSERT INTO pgembed.migrations (version, name, sha256) VALUES (%(version)s, %(name)s, %(sha256)s);

-- name: lock
-- Two `migrate` runs never interleave.
SELECT pg_catalog.pg_advisory_lock(%(key)s);

-- name: unlock
SELECT pg_catalog.pg_advisory_unlock(%(key)s);

-- name: vector_available
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_available_extensions WHERE name = 'vector');

-- name: whoami
-- Named in what migrate asks of someone else: quoted where an identifier needs it.
SELECT pg_catalog.quote_ident(pg_catalog.current_database()),
       pg_catalog.quote_ident(CURRENT_USER::text);

-- name: schema_owner
-- Who may migrate when this role may not: the pgembed schema's owner, else the database's.
SELECT pg_catalog.quote_ident(coalesce(
           (SELECT pg_catalog.pg_get_userbyid(n.nspowner) FROM pg_catalog.pg_namespace n
            WHERE n.nspname OPERATOR(pg_catalog.=) 'pgembed'),
           (SELECT pg_catalog.pg_get_userbyid(d.datdba) FROM pg_catalog.pg_database d
            WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()))),
       EXISTS (SELECT 1 FROM pg_catalog.pg_namespace n
               WHERE n.nspname OPERATOR(pg_catalog.=) 'pgembed'),
       pg_catalog.quote_ident(pg_catalog.current_database()),
       pg_catalog.quote_ident(CURRENT_USER::text);

-- name: vector_usable
-- Whether this role may use pgvector's schema (a migration's search_path names it, and a schema
-- without USAGE is left out of it silently); the schema and role, quoted, to say the GRANT.
SELECT pg_catalog.has_schema_privilege(%(schema)s::text, 'USAGE'),
       pg_catalog.quote_ident(%(schema)s::text), pg_catalog.quote_ident(CURRENT_USER::text);

-- name: pin
-- A migration's own search_path: pg_catalog, then pgvector's schema (its type and operators).
SELECT pg_catalog.set_config('search_path',
    'pg_catalog, ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(%(schema)s)
    OPERATOR(pg_catalog.||) ', pg_temp', true);

-- name: shadows
-- Functions and operators in pgvector's schema named like built-in ones and not part of any
-- extension: an overload with better-fitting argument types would win over pg_catalog's and run
-- as whoever calls it (CREATE on public is every role's before PostgreSQL 15).
SELECT pg_catalog.format('%%s %%I.%%s(%%s)', x.kind, n.nspname, x.name, x.args)
FROM (
    SELECT 'function' AS kind, p.pronamespace AS ns, p.proname::text AS name,
           pg_catalog.pg_get_function_identity_arguments(p.oid) AS args,
           p.oid AS oid, 'pg_catalog.pg_proc'::pg_catalog.regclass AS cls
    FROM pg_catalog.pg_proc p
    WHERE EXISTS (SELECT FROM pg_catalog.pg_proc c
                  WHERE c.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
                    AND c.proname OPERATOR(pg_catalog.=) p.proname)
    UNION ALL
    SELECT 'operator', o.oprnamespace, o.oprname::text,
           pg_catalog.format_type(o.oprleft, NULL) OPERATOR(pg_catalog.||) ', '
               OPERATOR(pg_catalog.||) pg_catalog.format_type(o.oprright, NULL),
           o.oid, 'pg_catalog.pg_operator'::pg_catalog.regclass
    FROM pg_catalog.pg_operator o
    WHERE EXISTS (SELECT FROM pg_catalog.pg_operator c
                  WHERE c.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
                    AND c.oprname OPERATOR(pg_catalog.=) o.oprname)
) x
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) x.ns
WHERE n.nspname OPERATOR(pg_catalog.=) %(schema)s
  AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d
                  WHERE d.classid OPERATOR(pg_catalog.=) x.cls
                    AND d.objid OPERATOR(pg_catalog.=) x.oid AND d.deptype OPERATOR(pg_catalog.=) 'e')
ORDER BY 1;

-- name: definitions_readable
-- Whether the record exists (migration 0013) and this role may read it.
SELECT coalesce(pg_catalog.has_table_privilege(
    pg_catalog.to_regclass('pgembed.definitions'), 'SELECT'), false);

-- name: defined
-- The definition files as last applied: file -> sha256.
SELECT file, sha256 FROM pgembed.definitions;

-- name: forget_definitions
DELETE FROM pgembed.definitions;

-- name: record_definition
INSERT INTO pgembed.definitions (file, sha256) VALUES (%(file)s, %(sha256)s);
