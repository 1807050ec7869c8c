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
