-- pgembed schema, current definition of what runs once: the schema, the vector extension, every
-- table, index and constraint, as they are after the last migration.
-- Not run by `pgembed migrate`, which applies migrations/*.sql (append-only, checksummed), then
-- re-applies sql/definitions/*.sql (functions, triggers, grants: their one definition). This is
-- the reader's reference for the tables, and tests/integration/test_schema.py checks that the
-- migrations and the definitions produce exactly this file's objects and the definitions'.
-- A change to a table is a new migration *and* an edit here.

-- pgembed's own schema (made by the bootstrap in migrate.py, before any migration).
CREATE SCHEMA pgembed;

-- pgvector: the vector type, its distance operators and HNSW indexes (needs 0.8.0 or later).
CREATE EXTENSION IF NOT EXISTS vector;

-- Applied migrations and the checksum each was applied with (made by migrate.py's bootstrap).
CREATE TABLE pgembed.migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- The sha256 of each file of sql/definitions/ as `pgembed migrate` last applied it: the files
-- are applied again when one differs (or a migration was applied), never otherwise.
CREATE TABLE pgembed.definitions (
    file       text PRIMARY KEY,
    sha256     text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

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
    model_revision       text,  -- unused (always NULL); kept so the table is unchanged
    pooling              text NOT NULL CHECK (pooling IN ('mean', 'cls', 'max')),
    normalize            boolean NOT NULL DEFAULT true,
    dimensions           integer NOT NULL CHECK (dimensions > 0),
    max_seq_length       integer NOT NULL CHECK (max_seq_length > 0),
    query_prefix         text NOT NULL DEFAULT '',
    document_prefix      text NOT NULL DEFAULT '',
    hnsw_m               integer NOT NULL DEFAULT 16,
    hnsw_ef_construction integer NOT NULL DEFAULT 200,
    -- hnsw.ef_search for this model's searches (`pgembed tune`); NULL: pgembed's default for the
    -- table's size (pgembed._default_ef_v1).
    ef_search            integer,
    -- 'active', or 'adding' and the steps of its setup still to do (lifecycle/setup.py): an
    -- interrupted `model add` or reindex start finishes them when run again.
    status               text NOT NULL DEFAULT 'active',
    created_at           timestamptz NOT NULL DEFAULT now(),
    -- The version of the settings above (pgembed.model_versions). Since 0003.
    version              integer NOT NULL DEFAULT 1 CHECK (version > 0),
    -- Set on a reindex's shadow: the model it will replace. At most one shadow per model.
    shadow_of            text UNIQUE REFERENCES pgembed.models (name),
    -- What every encoder of the model computes in (sync workers and queries alike): a torch
    -- precision or an engine (onnx-*, since 0009; onnx-int8-token since 0012). Since 0004.
    precision            text NOT NULL DEFAULT 'fp32' CONSTRAINT models_precision_check
        CHECK (precision IN
            ('fp32', 'bf16', 'fp16', 'int8', 'onnx-fp32', 'onnx-int8', 'onnx-int8-token')),
    -- What the user asked for; a request whose retrieval disagrees with fp32's falls back to fp32.
    precision_requested  text NOT NULL DEFAULT 'fp32' CONSTRAINT models_precision_requested_check
        CHECK (precision_requested IN
            ('auto', 'fp32', 'bf16', 'fp16', 'int8', 'onnx-fp32', 'onnx-int8', 'onnx-int8-token')),
    -- Cosine agreement with fp32 vectors when the precision was checked, and why it was chosen.
    precision_cosine     double precision,
    precision_note       text NOT NULL DEFAULT '',
    -- The columns embedded together, joined by a newline (text_column is the first). Since 0008.
    text_columns         text[] NOT NULL CONSTRAINT models_text_columns_check
        CHECK (cardinality(text_columns) >= 1 AND text_columns[1] = text_column),
    -- A text longer than the model's window: 'truncate' embeds its first window only; 'chunk'
    -- also embeds the rest, in overlapping windows kept in the table's pgembed_<name>_chunks
    -- (the first window stays in embedding_column). Since 0011.
    long_texts           text NOT NULL DEFAULT 'truncate' CONSTRAINT models_long_texts_check
        CHECK (long_texts IN ('truncate', 'chunk')),
    -- Two walks for an unfiltered search of 10 rows (`pgembed tune`; NULL: one walk of
    -- ef_search): a first walk of first_walk_ef_search, and a second of second_walk_ef_search
    -- when the first one's rows are at a mean cosine distance of second_walk_mean_distance or
    -- more. Since 0018.
    first_walk_ef_search integer,
    second_walk_ef_search integer,
    second_walk_mean_distance double precision,
    CONSTRAINT models_two_walks_check CHECK (
        (first_walk_ef_search IS NULL) = (second_walk_ef_search IS NULL)
        AND (first_walk_ef_search IS NULL) = (second_walk_mean_distance IS NULL)
        AND first_walk_ef_search >= 1 AND first_walk_ef_search < second_walk_ef_search
        AND second_walk_ef_search <= 1000 AND second_walk_mean_distance BETWEEN 0 AND 2)
);

-- Every version's settings, so `model alter` leaves a record of what each version embedded with.
CREATE TABLE pgembed.model_versions (
    name                 text NOT NULL REFERENCES pgembed.models (name) ON DELETE CASCADE,
    version              integer NOT NULL,
    model_ref            text NOT NULL,
    model_revision       text,  -- unused (always NULL)
    pooling              text NOT NULL,
    normalize            boolean NOT NULL,
    dimensions           integer NOT NULL,
    max_seq_length       integer NOT NULL,
    query_prefix         text NOT NULL,
    document_prefix      text NOT NULL,
    hnsw_m               integer NOT NULL,
    hnsw_ef_construction integer NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    -- When searches switched to this version; NULL while its reindex runs (or was abandoned).
    activated_at         timestamptz,
    PRIMARY KEY (name, version)
);

-- Work to do, one row per (model, source key); `seq` is the enqueuing transaction's id, so a
-- worker removes only the entries it claimed, and a claim's lease is next_attempt_at.
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
) WITH (  -- vacuumed and analyzed every 10,000 rows: a drained backlog's space is reused (0014)
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 10000
);
-- A model's ready keys, oldest lease first: the claim's index (since 0014).
CREATE INDEX queue_ready_idx ON pgembed.queue (model, next_attempt_at);

-- Inserted keys land here first (an append to an index-less table); workers move them to the queue.
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
-- Recent batches of a model, for the throughput in `pgembed status`.
CREATE INDEX batches_finished_idx ON pgembed.batches (model, finished_at);
