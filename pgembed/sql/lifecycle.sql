-- Static statements of a model's lifecycle: status, reindex, switch, index rebuild.
-- Loaded by pgembed.sqlfiles; statements that name the user's table are composed in Python.

-- name: queue_stats
-- status: backlog (queue and inbox), its oldest entry, failures, truncations, recent rows/s.
-- The backlog is the sum of both (a key inserted again before the first was moved to the queue
-- counts twice until it is): one pass over each (count and oldest together), no
-- de-duplication of a million keys.
WITH q AS (
    SELECT pg_catalog.count(*) AS n, pg_catalog.min(enqueued_at) AS oldest
    FROM pgembed.queue WHERE model = %(model)s
), i AS (
    SELECT pg_catalog.count(*) AS n, pg_catalog.min(enqueued_at) AS oldest
    FROM pgembed.inbox WHERE model = %(model)s
)
SELECT
    q.n + i.n AS queued,
    extract(epoch FROM pg_catalog.now() - least(q.oldest, i.oldest))::float AS oldest_queued_seconds,
    (SELECT pg_catalog.count(*) FROM pgembed.failures WHERE model = %(model)s) AS failed,
    (SELECT pg_catalog.count(*) FROM pgembed.truncated WHERE model = %(model)s) AS truncated,
    (SELECT coalesce(pg_catalog.sum(rows), 0)::float / 60::pg_catalog.float8 FROM pgembed.batches
       WHERE model = %(model)s AND finished_at > pg_catalog.now() - interval '1 minute') AS rows_per_second
FROM q, i;

-- name: live_workers
-- status: workers heard from within `live` seconds whose lease renewer is still connected (its
-- session is named `pgembed worker <last 8 characters of its id>`, sync.sql `name_renewer`): a
-- killed worker's session ends with it, so it stops counting at once, not a minute later.
SELECT id, host, pid, models, heartbeat_at
FROM pgembed.workers w
WHERE heartbeat_at > pg_catalog.now() - pg_catalog.make_interval(secs => %(live)s)
  AND EXISTS (SELECT FROM pg_catalog.pg_stat_activity a
              WHERE a.application_name = 'pgembed worker ' || pg_catalog.right(w.id, 8))
ORDER BY started_at;

-- name: last_worker_seen
-- status, when keys wait and no live worker serves the model: the newest trace of one, a
-- worker's last heartbeat (pruned after a day; a clean stop removes it at once) or the
-- model's last written batch (pruned after an hour); NULL when neither remains.
WITH seen AS (
    SELECT (SELECT pg_catalog.max(heartbeat_at) FROM pgembed.workers
            WHERE %(model)s = ANY (models)) AS heartbeat,
           (SELECT pg_catalog.max(finished_at) FROM pgembed.batches
            WHERE model = %(model)s) AS batch
)
SELECT CASE WHEN heartbeat IS NULL AND batch IS NULL THEN NULL
            WHEN batch IS NULL OR heartbeat >= batch THEN 'heartbeat' ELSE 'batch' END AS seen_by,
       greatest(heartbeat, batch) AS seen_at,
       extract(epoch FROM pg_catalog.now() - greatest(heartbeat, batch))::float AS seen_seconds
FROM seen;

-- name: recent_failures
-- status: the newest failures, for `pgembed retry`.
SELECT model, key, attempts, error, failed_at FROM pgembed.failures
ORDER BY failed_at DESC LIMIT %(limit)s;

-- name: lock_model_rows
-- A switch takes the model's and its shadow's catalog rows first, then the table: the order the
-- sync worker's write-back uses (catalog share lock, then rows), so the two never deadlock.
SELECT name FROM pgembed.models WHERE name = %(name)s OR shadow_of = %(name)s
ORDER BY name FOR UPDATE;

-- name: update_model
-- The switch: the live model takes the shadow's settings and version.
UPDATE pgembed.models SET
    model_ref = %(model_ref)s, pooling = %(pooling)s,
    normalize = %(normalize)s, dimensions = %(dimensions)s, max_seq_length = %(max_seq_length)s,
    query_prefix = %(query_prefix)s, document_prefix = %(document_prefix)s,
    hnsw_m = %(hnsw_m)s, hnsw_ef_construction = %(hnsw_ef_construction)s, version = %(version)s,
    precision = %(precision)s, precision_requested = %(precision_requested)s,
    precision_cosine = %(precision_cosine)s, precision_note = %(precision_note)s,
    long_texts = %(long_texts)s,
    -- Two walks' cutoff is a distance in the old version's space: one walk until tuned again.
    first_walk_ef_search = NULL, second_walk_ef_search = NULL, second_walk_mean_distance = NULL
WHERE name = %(name)s;

-- name: move_bookkeeping
-- The switch: the shadow's queue, failures and truncation marks become the model's; the old
-- version's go. Claims on moved keys are voided (the claimer's write-back finds its model gone).
DELETE FROM pgembed.queue WHERE model = %(name)s;
UPDATE pgembed.queue SET model = %(name)s, next_attempt_at = pg_catalog.now(), claimed_by = NULL
WHERE model = %(shadow)s;
DELETE FROM pgembed.inbox WHERE model = %(name)s;
UPDATE pgembed.inbox SET model = %(name)s WHERE model = %(shadow)s;
DELETE FROM pgembed.failures WHERE model = %(name)s;
UPDATE pgembed.failures SET model = %(name)s WHERE model = %(shadow)s;
DELETE FROM pgembed.truncated WHERE model = %(name)s;
UPDATE pgembed.truncated SET model = %(name)s WHERE model = %(shadow)s;
DELETE FROM pgembed.batches WHERE model = %(name)s;
UPDATE pgembed.batches SET model = %(name)s WHERE model = %(shadow)s;
DELETE FROM pgembed.models WHERE name = %(shadow)s;
UPDATE pgembed.model_versions SET activated_at = pg_catalog.now()
WHERE name = %(name)s AND version = %(version)s;

-- name: set_hnsw_parameters
-- An index rebuild records its parameters on the model and on its current version. Two walks
-- were measured on the old graph: one walk until tuned again.
UPDATE pgembed.models SET hnsw_m = %(m)s, hnsw_ef_construction = %(ef)s,
    first_walk_ef_search = NULL, second_walk_ef_search = NULL, second_walk_mean_distance = NULL
WHERE name = %(name)s;
UPDATE pgembed.model_versions SET hnsw_m = %(m)s, hnsw_ef_construction = %(ef)s
WHERE name = %(name)s AND version = (SELECT version FROM pgembed.models WHERE name = %(name)s);

-- name: forget_version
-- An aborted reindex: its version was never activated.
DELETE FROM pgembed.model_versions
WHERE name = %(name)s AND version = %(version)s AND activated_at IS NULL;

-- name: next_lease_seconds
-- How long until the first key of a model is ready again (claimed elsewhere, or backing off).
SELECT extract(epoch FROM pg_catalog.min(next_attempt_at) - pg_catalog.now())::float
FROM pgembed.queue WHERE model = %(model)s;

-- name: index_build_progress
-- A CREATE INDEX's progress, read from a second session.
SELECT phase, blocks_done, blocks_total, tuples_done, tuples_total
FROM pg_stat_progress_create_index WHERE pid = %(pid)s;

-- name: blocking_sessions
-- The sessions a CREATE INDEX CONCURRENTLY of backend `pid` waits for (a writer of the table,
-- or any older transaction with a snapshot): their state and how long their transaction is open.
SELECT b.pid, a.state,
       extract(epoch FROM pg_catalog.now() - a.xact_start)::float AS seconds, a.datname
FROM pg_catalog.unnest(pg_catalog.pg_blocking_pids(%(pid)s)) AS b(pid)
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) b.pid
ORDER BY b.pid;

-- name: estimated_rows
-- The planner's row count of a table (reltuples; -1 when never analysed), without a scan.
SELECT GREATEST(c.reltuples, 0)::bigint FROM pg_catalog.pg_class c
WHERE c.oid = pg_catalog.to_regclass(
    pg_catalog.format('%%I.%%I', %(schema)s::text, %(name)s::text))::pg_catalog.oid;

-- name: requeue_keys
-- `pgembed alter-table`: keys whose text the statement changed are queued as the update trigger
-- queues them (a claim in flight is voided: its write-back finds another seq); keys left with no
-- text, or no row, lose their pending work, failures and truncation marks. The inbox first, then
-- the queue: the order of the daemon's transfer, so the two never deadlock.
DELETE FROM pgembed.inbox WHERE model = %(model)s AND key = ANY (%(forgotten)s::pg_catalog.text[]);
INSERT INTO pgembed.queue AS q (model, key)
SELECT %(model)s, k FROM pg_catalog.unnest(%(queued)s::pg_catalog.text[]) AS k
ON CONFLICT (model, key) DO UPDATE
    SET seq = excluded.seq, enqueued_at = excluded.enqueued_at, attempts = 0,
        next_attempt_at = excluded.next_attempt_at, claimed_by = NULL, last_error = NULL;
DELETE FROM pgembed.queue WHERE model = %(model)s AND key = ANY (%(forgotten)s::pg_catalog.text[]);
DELETE FROM pgembed.truncated
WHERE model = %(model)s AND key = ANY (%(forgotten)s::pg_catalog.text[]);
DELETE FROM pgembed.failures
WHERE model = %(model)s AND key = ANY (%(forgotten)s::pg_catalog.text[]);

-- name: unguarded
-- Whether a model's table and vector column are there without its vector guard trigger, or with
-- an older one: inserts only (16: TRIGGER_TYPE_UPDATE), or flagged writes not called for (its
-- WHEN does not read pgembed.writing) (lifecycle/setup.py guard_older_models).
SELECT EXISTS (
    SELECT FROM pg_catalog.pg_attribute a
    WHERE a.attrelid = pg_catalog.to_regclass(
              pg_catalog.format('%%I.%%I', %(schema)s::text, %(table)s::text))
      AND a.attname OPERATOR(pg_catalog.=) %(column)s::text AND NOT a.attisdropped
) AND NOT EXISTS (
    SELECT FROM pg_catalog.pg_trigger g
    WHERE g.tgrelid = pg_catalog.to_regclass(
              pg_catalog.format('%%I.%%I', %(schema)s::text, %(table)s::text))
      AND g.tgname OPERATOR(pg_catalog.=) %(trigger)s::text
      AND (g.tgtype::pg_catalog.int4 OPERATOR(pg_catalog.&) 16) OPERATOR(pg_catalog.<>) 0
      AND pg_catalog.strpos(pg_catalog.pg_get_triggerdef(g.oid), 'pgembed.writing') > 0
)
