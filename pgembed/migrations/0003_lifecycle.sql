-- pgembed 0003: model lifecycle. A model's settings have versions; a reindex fills a shadow model
-- (a catalog row with `shadow_of` set, its own column, triggers and queue) and then switches it in.

ALTER TABLE pgembed.models
    ADD COLUMN version integer NOT NULL DEFAULT 1 CHECK (version > 0),
    -- Set on a reindex's shadow: the model it will replace. At most one shadow per model.
    ADD COLUMN shadow_of text UNIQUE REFERENCES pgembed.models (name);

-- Every version's settings, so `model alter` leaves a record of what each version embedded with.
CREATE TABLE pgembed.model_versions (
    name                 text NOT NULL REFERENCES pgembed.models (name) ON DELETE CASCADE,
    version              integer NOT NULL,
    model_ref            text NOT NULL,
    model_revision       text,
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

INSERT INTO pgembed.model_versions (
    name, version, model_ref, model_revision, pooling, normalize, dimensions, max_seq_length,
    query_prefix, document_prefix, hnsw_m, hnsw_ef_construction, created_at, activated_at)
SELECT name, version, model_ref, model_revision, pooling, normalize, dimensions, max_seq_length,
       query_prefix, document_prefix, hnsw_m, hnsw_ef_construction, created_at, created_at
FROM pgembed.models;
