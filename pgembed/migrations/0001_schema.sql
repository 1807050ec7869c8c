-- pgembed 0001: the vector extension, the catalog, the queue and its bookkeeping tables,
-- and the change-capture trigger functions that per-model triggers call.
-- User identifiers reach SQL here only through format('%I').

CREATE EXTENSION IF NOT EXISTS vector;

-- The model registry: one row per embedding space (checkpoint + pooling + normalisation + ...).
CREATE TABLE pgembed.models (
    name                 text PRIMARY KEY CHECK (name ~ '^[a-z][a-z0-9_]{0,47}$'),
    table_schema         text NOT NULL,
    table_name           text NOT NULL,
    key_column           text NOT NULL,
    key_type             text NOT NULL,
    text_column          text NOT NULL,
    embedding_column     text NOT NULL,
    model_ref            text NOT NULL,
    model_revision       text,
    pooling              text NOT NULL CHECK (pooling IN ('mean', 'cls', 'max')),
    normalize            boolean NOT NULL DEFAULT true,
    dimensions           integer NOT NULL CHECK (dimensions > 0),
    max_seq_length       integer NOT NULL CHECK (max_seq_length > 0),
    query_prefix         text NOT NULL DEFAULT '',
    document_prefix      text NOT NULL DEFAULT '',
    hnsw_m               integer NOT NULL DEFAULT 16,
    hnsw_ef_construction integer NOT NULL DEFAULT 64,
    ef_search            integer,
    status               text NOT NULL DEFAULT 'active',
    created_at           timestamptz NOT NULL DEFAULT now()
);

-- Work to do, one row per (model, source key). `seq` is the id of the transaction that enqueued
-- the key: a worker that finishes a batch removes only the entries it claimed, never a newer
-- enqueue of the same key (which always comes from a later transaction). Taking it from the
-- transaction rather than a sequence keeps bulk loads at one value per statement.
-- A claim pushes next_attempt_at forward by the lease: a killed worker's rows come back by themselves.
-- No index on next_attempt_at: claims walk the primary key, and one index fewer keeps capture cheap.
CREATE TABLE pgembed.queue (
    model           text NOT NULL,
    key             text NOT NULL,
    seq             bigint NOT NULL DEFAULT pg_current_xact_id()::text::bigint,
    enqueued_at     timestamptz NOT NULL DEFAULT now(),
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    claimed_by      text,
    last_error      text,
    PRIMARY KEY (model, key)
);

-- Inserted keys land here first: an append to an index-less table is the cheapest thing an
-- application's bulk INSERT or COPY can pay for capture. Workers move them to the queue (where the
-- indexed, deduplicated bookkeeping happens) off the application's write path.
CREATE TABLE pgembed.inbox (
    model       text NOT NULL,
    key         text NOT NULL,
    seq         bigint NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT now()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000);

-- Keys that failed their last attempt; `pgembed retry` moves them back to the queue.
CREATE TABLE pgembed.failures (
    model     text NOT NULL,
    key       text NOT NULL,
    attempts  integer NOT NULL,
    error     text NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (model, key)
);

-- Rows whose text was longer than the model's max sequence length when last embedded.
CREATE TABLE pgembed.truncated (
    model text NOT NULL,
    key   text NOT NULL,
    PRIMARY KEY (model, key)
);

-- Live sync workers and their heartbeats.
CREATE TABLE pgembed.workers (
    id           text PRIMARY KEY,
    host         text NOT NULL,
    pid          integer NOT NULL,
    models       text[] NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now()
);

-- One row per written batch, kept for an hour: throughput in `pgembed status`.
CREATE TABLE pgembed.batches (
    model       text NOT NULL,
    worker_id   text NOT NULL,
    rows        integer NOT NULL,
    seconds     double precision NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX batches_finished_idx ON pgembed.batches (model, finished_at);

-- Change capture. Per-model triggers pass (model, key column, text column[, embedding column]).
-- Inserts are captured per statement from the transition table into the inbox, so bulk loads pay
-- one unindexed append and one NOTIFY, not an indexed upsert and a NOTIFY per row. Only NULL
-- and '' are filtered here (btrim on every row would cost more than the append itself); the
-- worker drops whitespace-only texts when it reads them.
CREATE FUNCTION pgembed.capture_insert_v1() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    queued bigint;
BEGIN
    EXECUTE format(
        'INSERT INTO pgembed.inbox (model, key, seq)
         SELECT $1, n.%1$I::text, $2 FROM pgembed_new n WHERE n.%2$I <> ''''',
        TG_ARGV[1], TG_ARGV[2]) USING TG_ARGV[0], pg_current_xact_id()::text::bigint;
    GET DIAGNOSTICS queued = ROW_COUNT;
    IF queued > 0 THEN
        PERFORM pg_notify('pgembed', TG_ARGV[0]);
    END IF;
    RETURN NULL;
END
$fn$;

-- Fires only when the embedded text really changed (the trigger's WHEN clause is checked in C,
-- so updates of other columns and pgembed's own vector writes cost nothing). The old vector is
-- cleared in the same row write, so it is never served for the new text.
CREATE FUNCTION pgembed.capture_update_v1() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    new_key text := to_jsonb(NEW) ->> TG_ARGV[1];
    new_text text := to_jsonb(NEW) ->> TG_ARGV[2];
BEGIN
    NEW := jsonb_populate_record(NEW, jsonb_build_object(TG_ARGV[3], NULL));
    IF btrim(new_text) <> '' THEN
        INSERT INTO pgembed.queue AS q (model, key) VALUES (TG_ARGV[0], new_key)
        ON CONFLICT (model, key) DO UPDATE
            SET seq = excluded.seq, enqueued_at = excluded.enqueued_at, attempts = 0,
                next_attempt_at = excluded.next_attempt_at, claimed_by = NULL, last_error = NULL;
        PERFORM pg_notify('pgembed', TG_ARGV[0]);
    ELSE
        DELETE FROM pgembed.queue WHERE model = TG_ARGV[0] AND key = new_key;
    END IF;
    RETURN NEW;
END
$fn$;

CREATE FUNCTION pgembed.capture_delete_v1() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE format(
        'DELETE FROM pgembed.queue q USING pgembed_old o
         WHERE q.model = $1 AND q.key = o.%1$I::text',
        TG_ARGV[1]) USING TG_ARGV[0];
    EXECUTE format(
        'DELETE FROM pgembed.inbox i USING pgembed_old o
         WHERE i.model = $1 AND i.key = o.%1$I::text',
        TG_ARGV[1]) USING TG_ARGV[0];
    EXECUTE format(
        'DELETE FROM pgembed.truncated t USING pgembed_old o
         WHERE t.model = $1 AND t.key = o.%1$I::text',
        TG_ARGV[1]) USING TG_ARGV[0];
    RETURN NULL;
END
$fn$;

CREATE FUNCTION pgembed.capture_truncate_v1() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM pgembed.queue WHERE model = TG_ARGV[0];
    DELETE FROM pgembed.inbox WHERE model = TG_ARGV[0];
    DELETE FROM pgembed.truncated WHERE model = TG_ARGV[0];
    DELETE FROM pgembed.failures WHERE model = TG_ARGV[0];
    RETURN NULL;
END
$fn$;
