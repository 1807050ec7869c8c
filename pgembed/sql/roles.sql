-- The group roles of least privilege (`pgembed migrate --create-roles`), and their grants.
-- Loaded by pgembed.sqlfiles; pgembed/roles.py runs them. docs/security.md lists the same.
-- An application that only writes its own table needs no role and no grant here: the capture
-- triggers run as the owner of pgembed's functions.

-- name: create
-- NOLOGIN group roles: grant them to login roles (GRANT pgembed_daemon TO my_worker).
DO $do$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgembed_daemon') THEN
        CREATE ROLE pgembed_daemon NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'pgembed_reader') THEN
        CREATE ROLE pgembed_reader NOLOGIN;
    END IF;
END
$do$;

-- name: exists
SELECT pg_catalog.to_regrole(%(role)s) IS NOT NULL;

-- name: daemon_columns
-- The columns of a table the daemon role holds privileges on, by their names now (a model's
-- column renamed since keeps its privileges under the new name).
SELECT DISTINCT a.attname
FROM pg_catalog.pg_attribute a, pg_catalog.aclexplode(a.attacl) x
WHERE a.attrelid OPERATOR(pg_catalog.=)
          pg_catalog.format('%%I.%%I', %(schema)s::text, %(name)s::text)::pg_catalog.regclass
  AND x.grantee OPERATOR(pg_catalog.=) 'pgembed_daemon'::pg_catalog.regrole
  AND NOT a.attisdropped
ORDER BY a.attname;

-- name: schema_grantable
-- Whether the daemon role lacks USAGE on a schema (a watched table's, or its key type's) and
-- this role may grant it (the schema's owner, a superuser, or a holder WITH GRANT OPTION); a
-- grant without that right would fail or grant nothing.
SELECT NOT pg_catalog.has_schema_privilege('pgembed_daemon', n.oid, 'USAGE')
       AND pg_catalog.has_schema_privilege(n.oid, 'USAGE WITH GRANT OPTION')
FROM pg_catalog.pg_namespace n
WHERE n.nspname OPERATOR(pg_catalog.=) %(schema)s::pg_catalog.name;

-- name: grant_daemon
-- The sync daemon: the catalog to read, the queues to work, its heartbeat and batch records.
GRANT USAGE ON SCHEMA pgembed TO pgembed_daemon;
GRANT SELECT ON pgembed.migrations, pgembed.definitions, pgembed.models, pgembed.model_versions
    TO pgembed_daemon;
GRANT SELECT, INSERT, UPDATE, DELETE ON pgembed.queue, pgembed.inbox, pgembed.failures,
    pgembed.truncated, pgembed.workers, pgembed.batches TO pgembed_daemon;
-- A batch's write-back locks its model's catalog row FOR SHARE (so a reindex switch waits for
-- it), and row locks need UPDATE on some column: the one column nothing reads.
GRANT UPDATE (status) ON pgembed.models TO pgembed_daemon;
-- Writing a table as its owner (sql/definitions/40_sync.sql).
GRANT EXECUTE ON FUNCTION pgembed._write_as_owner_v1(text, text, text, text[], text[], anyarray)
    TO pgembed_daemon;

-- name: grant_reader
-- Searches: the helpers read the catalog (they run as the caller, who must also be able to
-- SELECT the table: GRANT SELECT ON <table> TO <reader>). Not the queues: they hold keys and
-- errors of every watched table, some of which a reader may not see (`status` needs the
-- daemon's role).
GRANT USAGE ON SCHEMA pgembed TO pgembed_reader;
GRANT SELECT ON pgembed.migrations, pgembed.definitions, pgembed.models, pgembed.model_versions
    TO pgembed_reader;
REVOKE ALL ON pgembed.queue, pgembed.inbox, pgembed.failures, pgembed.truncated,
    pgembed.workers, pgembed.batches FROM pgembed_reader;
