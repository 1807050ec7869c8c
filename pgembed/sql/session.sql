-- Settings of every session pgembed opens (the CLI, the daemon, the Client's pools).
-- Loaded by pgembed.sqlfiles.

-- name: pin
-- Keys travel as text in one canonical form, whatever the role's defaults: the capture triggers
-- write them under the same settings (sql/definitions/20_capture.sql). search_path is left as
-- the role has it (a user's own SQL on these sessions may create tables); pgembed's own SQL
-- writes built-ins as pg_catalog.x, and its functions pin search_path themselves.
SELECT pg_catalog.set_config('datestyle', 'ISO, MDY', false),
       pg_catalog.set_config('intervalstyle', 'postgres', false),
       pg_catalog.set_config('timezone', 'UTC', false),
       pg_catalog.set_config('extra_float_digits', '1', false),
       pg_catalog.set_config('bytea_output', 'hex', false);

-- name: statement_timeout
-- A limit on each statement of the session (milliseconds, as text), for `pgembed serve`'s pool.
SELECT pg_catalog.set_config('statement_timeout', %(ms)s, false);

-- name: vector_schema
-- Where pgvector lives: its type is looked up by this schema, not through search_path.
SELECT n.nspname FROM pg_catalog.pg_extension e
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
WHERE e.extname OPERATOR(pg_catalog.=) 'vector';
