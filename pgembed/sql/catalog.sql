-- Static statements of the catalog: the model registry, and what pgembed reads of a user's table.
-- Loaded by pgembed.sqlfiles. The registry's SELECT and INSERT list ModelSpec's fields, so they
-- are composed from the dataclass in catalog/registry.py (one source for the column list).

-- name: model_exists
SELECT EXISTS (SELECT 1 FROM pgembed.models WHERE name = %(name)s);

-- name: model_setup
-- What is left of a model's setup (`model add`, a reindex's start): 'active' when none, else
-- 'adding' and the steps to finish, '+'-separated (lifecycle/setup.py).
SELECT status FROM pgembed.models WHERE name = %(name)s;

-- name: set_model_setup
UPDATE pgembed.models SET status = %(status)s WHERE name = %(name)s;

-- name: delete_model
DELETE FROM pgembed.models WHERE name = %(name)s;

-- name: record_version
-- Keep a model's current settings as its version `version`; a version left by an abandoned
-- reindex is overwritten by the next attempt at that number.
INSERT INTO pgembed.model_versions AS v (
    name, version, model_ref, pooling, normalize, dimensions, max_seq_length,
    query_prefix, document_prefix, hnsw_m, hnsw_ef_construction, activated_at)
SELECT %(version_of)s, version, model_ref, pooling, normalize, dimensions, max_seq_length,
       query_prefix, document_prefix, hnsw_m, hnsw_ef_construction,
       CASE WHEN %(active)s THEN now() END
FROM pgembed.models WHERE name = %(name)s
ON CONFLICT (name, version) DO UPDATE SET
    (model_ref, pooling, normalize, dimensions, max_seq_length, query_prefix, document_prefix,
     hnsw_m, hnsw_ef_construction, created_at, activated_at)
  = (excluded.model_ref, excluded.pooling, excluded.normalize, excluded.dimensions,
     excluded.max_seq_length, excluded.query_prefix, excluded.document_prefix, excluded.hnsw_m,
     excluded.hnsw_ef_construction, now(), excluded.activated_at);

-- name: set_precision
-- A precision change applies only while the model is still at the version it was checked for.
UPDATE pgembed.models SET precision = %(precision)s, precision_requested = %(precision_requested)s,
    precision_cosine = %(precision_cosine)s, precision_note = %(precision_note)s
WHERE name = %(name)s AND version = %(version)s;

-- name: set_key_type
-- `pgembed alter-table` records the key column's new type (the daemon's casts use it).
UPDATE pgembed.models SET key_type = %(key_type)s WHERE name = %(name)s;

-- name: set_tuning
-- `pgembed tune` records the model's hnsw.ef_search (NULL: pgembed's default for the table's
-- size) and its two walks (NULL: one walk).
UPDATE pgembed.models SET ef_search = %(ef_search)s,
    first_walk_ef_search = %(first)s, second_walk_ef_search = %(second)s,
    second_walk_mean_distance = %(distance)s
WHERE name = %(name)s;

-- name: table_oid
-- A user's table (plain or partitioned) by schema and name.
SELECT c.oid FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = %(name)s AND c.relkind IN ('r', 'p');

-- name: relation_kind
-- What schema.name is when it is no table (a view, a materialized view, ...): its relkind.
SELECT c.relkind FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %(schema)s AND c.relname = %(name)s;

-- name: table_columns
-- Its columns and their types, in order.
SELECT attname, pg_catalog.format_type(atttypid, atttypmod) FROM pg_catalog.pg_attribute
WHERE attrelid = %(oid)s::pg_catalog.oid AND attnum > 0 AND NOT attisdropped ORDER BY attnum;

-- name: untrusted_columns
-- Its columns whose type a non-superuser owns (a composite or domain type of a user's): such a
-- type's casts and I/O are its owner's code, which the capture functions (SECURITY DEFINER) and
-- the daemon would run as themselves. Built-in and extension types belong to a superuser.
-- pgembed._missing_column_v1 is the capture functions' copy of this rule.
SELECT a.attname, pg_catalog.format_type(a.atttypid, NULL) FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid
JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) t.typowner
WHERE a.attrelid = %(oid)s::pg_catalog.oid AND a.attnum > 0 AND NOT a.attisdropped
  AND NOT r.rolsuper ORDER BY a.attnum;

-- name: table_unique_indexes
-- Its unique, non-partial indexes (the primary key flagged) with their columns in order.
SELECT i.indisprimary, pg_catalog.array_agg(a.attname ORDER BY k.ord)
FROM pg_catalog.pg_index i
CROSS JOIN LATERAL pg_catalog.unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = %(oid)s::pg_catalog.oid AND i.indisunique AND i.indpred IS NULL
GROUP BY i.indexrelid, i.indisprimary;

-- name: index_valid
-- Whether an index is usable (false: an interrupted concurrent build left it invalid).
SELECT indisvalid FROM pg_catalog.pg_index
WHERE indexrelid = pg_catalog.to_regclass(
    pg_catalog.format('%%I.%%I', %(schema)s::text, %(name)s::text))::pg_catalog.oid;

-- name: relation_exists
-- Whether schema.name is taken by any relation (table, view, ...).
SELECT pg_catalog.to_regclass(pg_catalog.format('%%I.%%I', %(schema)s::text, %(name)s::text))
    IS NOT NULL;

-- name: own_chunks
-- Whether schema.name is pgembed's chunk table (see pgembed._own_chunks_v1).
SELECT pgembed._own_chunks_v1(pg_catalog.format('%%I.%%I', %(schema)s::text, %(name)s::text))
    IS NOT NULL;

-- name: chunk_names
-- Of a chunked model's names (`names`: its chunk table first, then that table's index and key):
-- whether the first is pgembed's chunk table (_own_chunks_v1); which of them another object
-- holds in the schema, a relation that is neither that chunk table nor an index of it (any
-- relation unless `exempt`: where the model has no chunk table, one of pgembed's owner's by that
-- name is not its own), or a type no relation owns (an enum, a domain), since a reindex's switch
-- renames its shadow's chunk table and indexes to them; and pgembed's owner (pgembed_owner
-- below), who may be given one back.
WITH own AS (
    SELECT (CASE WHEN %(exempt)s THEN
                pgembed._own_chunks_v1(pg_catalog.format('%%I.%%I', %(schema)s::text,
                                                         (%(names)s::text[])[1])) END
           )::pg_catalog.oid AS oid,
           pg_catalog.to_regnamespace(pg_catalog.quote_ident(%(schema)s::text)) AS nsp)
SELECT own.oid IS NOT NULL,
       ARRAY(SELECT n.name
             FROM pg_catalog.unnest(%(names)s::text[]) AS n(name)
             WHERE EXISTS (
                     SELECT FROM pg_catalog.pg_class c
                     WHERE c.relnamespace OPERATOR(pg_catalog.=) own.nsp
                       AND c.relname OPERATOR(pg_catalog.=) n.name
                       AND c.oid IS DISTINCT FROM own.oid
                       AND NOT EXISTS (SELECT FROM pg_catalog.pg_index i
                                       WHERE i.indexrelid OPERATOR(pg_catalog.=) c.oid
                                         AND i.indrelid OPERATOR(pg_catalog.=) own.oid))
                OR EXISTS (
                     SELECT FROM pg_catalog.pg_type t
                     WHERE t.typnamespace OPERATOR(pg_catalog.=) own.nsp
                       AND t.typname OPERATOR(pg_catalog.=) n.name
                       AND t.typrelid OPERATOR(pg_catalog.=) 0)
             ORDER BY n.name),
       (SELECT k.relowner::pg_catalog.regrole::text FROM pg_catalog.pg_class k
        WHERE k.oid OPERATOR(pg_catalog.=) 'pgembed.models'::pg_catalog.regclass)
FROM own;

-- name: pgembed_owner
-- pgembed's owner: the owner of its catalog (the role that first ran `pgembed migrate`, as its
-- capture functions do; see pgembed._own_chunks_v1), and whether it is this role.
SELECT r.rolname, r.rolname OPERATOR(pg_catalog.=) CURRENT_USER
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) c.relowner
WHERE c.oid OPERATOR(pg_catalog.=) 'pgembed.models'::pg_catalog.regclass;

-- name: table_column_flags
-- Whether the table is partitioned, which of its columns are NOT NULL and which GENERATED, the
-- partitioned table it is a partition of (quoted, qualified), if any, and its inheritance
-- children (INHERITS; not partitions), if any.
SELECT c.relkind = 'p', a.attname, a.attnotnull, a.attgenerated IN ('s', 'v'),
       (SELECT pg_catalog.format('%%I.%%I', pn.nspname, pc.relname)
        FROM pg_catalog.pg_inherits i
        JOIN pg_catalog.pg_class pc ON pc.oid = i.inhparent
        JOIN pg_catalog.pg_namespace pn ON pn.oid = pc.relnamespace
        WHERE c.relispartition AND i.inhrelid = c.oid),
       (SELECT pg_catalog.array_agg(pg_catalog.format('%%I.%%I', kn.nspname, k.relname)
                                    ORDER BY kn.nspname, k.relname)
        FROM pg_catalog.pg_inherits i
        JOIN pg_catalog.pg_class k ON k.oid = i.inhrelid
        JOIN pg_catalog.pg_namespace kn ON kn.oid = k.relnamespace
        WHERE i.inhparent = c.oid AND NOT k.relispartition)
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.oid = %(oid)s::pg_catalog.oid;

-- name: table_lock_holders
-- Other sessions that hold a lock on schema.name (they made a DDL statement wait).
SELECT pg_catalog.array_agg(DISTINCT l.pid ORDER BY l.pid) FROM pg_catalog.pg_locks l
WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_catalog.pg_backend_pid()
  AND l.relation = pg_catalog.to_regclass(
      pg_catalog.format('%%I.%%I', %(schema)s::text, %(name)s::text))::pg_catalog.oid;

-- name: cancel_autovacuum
-- Cancel an autovacuum of schema.name that holds a lock DDL is about to wait for: PostgreSQL
-- cancels it anyway once the DDL has waited deadlock_timeout (1 s), every query on the table
-- queued behind. Never one that prevents wraparound (PostgreSQL does not cancel those either).
-- Needs superuser or pg_signal_autovacuum_worker (PostgreSQL 18); the pids it signalled.
SELECT pg_catalog.array_agg(a.pid ORDER BY a.pid) FILTER (WHERE pg_catalog.pg_cancel_backend(a.pid))
FROM pg_catalog.pg_stat_activity a
WHERE a.backend_type = 'autovacuum worker'
  -- A role that may not read other sessions' queries sees '<insufficient privilege>': such a
  -- worker could be one that prevents wraparound, so it is left alone.
  AND a.query LIKE 'autovacuum:%%'
  AND a.query NOT LIKE '%%to prevent wraparound%%'
  AND a.datname = pg_catalog.current_database()
  AND EXISTS (SELECT 1 FROM pg_catalog.pg_locks l WHERE l.pid OPERATOR(pg_catalog.=) a.pid
      AND l.granted
      AND l.locktype = 'relation'
      AND l.relation = pg_catalog.to_regclass(
          pg_catalog.format('%%I.%%I', %(schema)s::text, %(name)s::text))::pg_catalog.oid);

-- name: table_live_rows
-- `pgembed status` at scale, without reading the table: its live rows as the statistics system
-- counts them at each commit (inserts less deletes; 0 after a crash until the next vacuum).
SELECT pg_catalog.pg_stat_get_live_tuples(c.oid)
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
WHERE n.nspname OPERATOR(pg_catalog.=) %(schema)s AND c.relname OPERATOR(pg_catalog.=) %(name)s;

-- name: table_trust
-- Whose rights pgembed's daemon would lend a watched table's owner, and whether row-level
-- security filters what this role reads of it (PostgreSQL's own answer: not the owner, or
-- FORCE ROW LEVEL SECURITY, and neither BYPASSRLS nor SUPERUSER). See catalog/trust.py. Found
-- by name, not to_regclass: without USAGE on the table's schema (the column before last) that
-- fails, as every read of the table would; the last column is the schema of the key's type when
-- this role may not use it (its keys could not be cast to it).
SELECT r.rolname, r.rolsuper, r.rolname OPERATOR(pg_catalog.=) SESSION_USER,
       pg_catalog.pg_has_role(CURRENT_USER, c.relowner, 'SET'),
       -- The owner may already act as this role and as this session's: SET ROLE to each, or
       -- grant it to itself by an ADMIN option it holds or may SET ROLE to a holder of (the
       -- option PostgreSQL 16+ gives the role that created a role, e.g. a managed admin).
       (SELECT pg_catalog.bool_and(pg_catalog.pg_has_role(c.relowner, w.oid, 'SET') OR EXISTS (
                   SELECT 1 FROM pg_catalog.pg_auth_members m
                   WHERE m.roleid OPERATOR(pg_catalog.=) w.oid AND m.admin_option
                     AND pg_catalog.pg_has_role(c.relowner, m.member, 'SET')))
        FROM pg_catalog.pg_roles w
        WHERE w.rolname OPERATOR(pg_catalog.=) ANY (ARRAY[CURRENT_USER, SESSION_USER])),
       pg_catalog.has_database_privilege(c.relowner, pg_catalog.current_database(), 'TEMP'),
       pg_catalog.has_database_privilege(CURRENT_USER, pg_catalog.current_database(), 'TEMP'),
       pg_catalog.row_security_active(c.oid), CURRENT_USER::pg_catalog.text,
       pg_catalog.has_schema_privilege(n.oid, 'USAGE'), k.schema,
       -- A direct write (not as the owner) is this role's UPDATE of the vector column.
       pg_catalog.has_column_privilege(c.oid, %(vector)s::pg_catalog.text, 'UPDATE')
FROM pg_catalog.pg_class c
-- The key type's schema, when this role may not use it.
LEFT JOIN LATERAL (
    SELECT s.nspname AS schema FROM pg_catalog.pg_namespace s
    WHERE s.nspname OPERATOR(pg_catalog.=) pgembed._key_schema_v1(
              %(schema)s::pg_catalog.text, %(name)s::pg_catalog.text, %(key)s::pg_catalog.text)
      AND NOT pg_catalog.has_schema_privilege(s.oid, 'USAGE')
) k ON true
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) c.relowner
WHERE n.nspname OPERATOR(pg_catalog.=) %(schema)s::pg_catalog.name
  AND c.relname OPERATOR(pg_catalog.=) %(name)s::pg_catalog.name
  AND c.relkind OPERATOR(pg_catalog.=) ANY ('{r,p}'::pg_catalog.char[]);

-- name: column_views
-- Views (and materialized views) that read a column, or with %(column)s NULL any column of the
-- relation: dropping it, as a reindex's switch and `model remove` do (the column; a chunked
-- model's chunk table), would fail on them (a `SELECT *` view names every column it saw).
SELECT DISTINCT pg_catalog.format('%%I.%%I', vn.nspname, v.relname)
FROM pg_catalog.pg_depend d
JOIN pg_catalog.pg_rewrite r ON r.oid OPERATOR(pg_catalog.=) d.objid
JOIN pg_catalog.pg_class v ON v.oid OPERATOR(pg_catalog.=) r.ev_class
JOIN pg_catalog.pg_namespace vn ON vn.oid OPERATOR(pg_catalog.=) v.relnamespace
LEFT JOIN pg_catalog.pg_attribute a
  ON a.attrelid OPERATOR(pg_catalog.=) d.refobjid
 AND a.attnum OPERATOR(pg_catalog.=) d.refobjsubid
WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass
  AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
  AND d.refobjid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(
      pg_catalog.format('%%I.%%I', %(schema)s::pg_catalog.text, %(table)s::pg_catalog.text)
  )::pg_catalog.oid
  AND (%(column)s::pg_catalog.name IS NULL
       OR a.attname OPERATOR(pg_catalog.=) %(column)s::pg_catalog.name)
  AND v.oid OPERATOR(pg_catalog.<>) d.refobjid
ORDER BY 1;
