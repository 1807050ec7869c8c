-- Every static statement of the sync path (claim, read, write-back, account, workers).
-- Loaded by pgembed.sqlfiles; pgembed/sync/store.py is the only caller, but for `notify`
-- (capture.notify: whatever queues keys wakes the workers with it).

-- name: claim
-- Take up to `limit` ready keys, oldest lease first; the lease is the pushed-forward
-- next_attempt_at, so a killed worker's keys become ready again by themselves. One short
-- statement (after `claim_by_index`, in the same short transaction): no transaction stays open.
-- Its plan does not depend on the queue's statistics, stale after a bulk enqueue (a million
-- keys of a model ANALYZE never saw): the keys come from queue_ready_idx in its order, stopping
-- at the LIMIT, and the UPDATE reaches them by ctid (a Tid Scan), so no join is planned that
-- loops over the whole queue once per picked key (52 s at 1M keys with `UPDATE ... FROM
-- picked`). A row locked here cannot move: its ctid holds.
UPDATE pgembed.queue q
SET next_attempt_at = pg_catalog.now() + pg_catalog.make_interval(secs => %(lease)s), claimed_by = %(worker)s
WHERE q.ctid = ANY (ARRAY(
    SELECT ctid FROM pgembed.queue
    WHERE model = %(model)s AND next_attempt_at <= pg_catalog.now()
    ORDER BY next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
))
RETURNING q.key, q.seq, q.attempts;

-- name: claim_by_index
-- Just before `claim`, in its transaction: the planner may use index and Tid scans only. On
-- stale statistics (a model's keys all enqueued at one instant, by `model add`) a bitmap scan
-- and a sort of every ready key looked cheaper than the index's first rows: 0.13 s a claim at
-- 100k keys, a second at a million, until the next ANALYZE.
SELECT pg_catalog.set_config('enable_seqscan', 'off', true),
       pg_catalog.set_config('enable_bitmapscan', 'off', true),
       pg_catalog.set_config('enable_sort', 'off', true);

-- name: transfer
-- Move up to `limit` inbox entries of a model into the queue. SKIP LOCKED lets several workers
-- move disjoint chunks at once; a key inserted twice keeps its latest enqueue, and an entry
-- never replaces a newer one already queued (an UPDATE after the INSERT): that one may be
-- claimed, and would be handed out a second time.
WITH moved AS (
    DELETE FROM pgembed.inbox i
    WHERE i.ctid = ANY (ARRAY(
        SELECT ctid FROM pgembed.inbox WHERE model = %(model)s
        LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    ))
    RETURNING i.key, i.seq, i.enqueued_at
)
INSERT INTO pgembed.queue AS q (model, key, seq, enqueued_at)
SELECT DISTINCT ON (key) %(model)s, key, seq, enqueued_at FROM moved ORDER BY key, seq DESC
ON CONFLICT (model, key) DO UPDATE
SET seq = excluded.seq, enqueued_at = excluded.enqueued_at, attempts = 0,
    next_attempt_at = pg_catalog.now(), claimed_by = NULL, last_error = NULL
WHERE q.seq < excluded.seq;

-- name: write_as_owner
-- A slice's vectors written as the table's owner, the write-back's last statement (store.py's
-- write_as_owner composes the UPDATE; sql/definitions/40_sync.sql says how it runs as the owner).
SELECT pgembed._write_as_owner_v1(
    %s, %s, %s, %s::pg_catalog.text[], %s::pg_catalog.text[], %b);

-- name: complete
-- Remove exactly the entries that were claimed: a key enqueued again meanwhile has a new seq.
DELETE FROM pgembed.queue q
USING ROWS FROM (pg_catalog.unnest(%(keys)s::text[]), pg_catalog.unnest(%(seqs)s::bigint[])) AS d(key, seq)
WHERE q.model = %(model)s AND q.key = d.key AND q.seq = d.seq;

-- name: release
-- Hand claimed keys back at once (a batch that will not be embedded).
UPDATE pgembed.queue q
SET next_attempt_at = pg_catalog.now(), claimed_by = NULL
FROM ROWS FROM (pg_catalog.unnest(%(keys)s::text[]), pg_catalog.unnest(%(seqs)s::bigint[])) AS d(key, seq)
WHERE q.model = %(model)s AND q.key = d.key AND q.seq = d.seq;

-- name: postpone
-- Hand claimed keys back for a later try (not counted as an attempt): their rows were held by
-- another transaction at the write-back. The pause is half the time the key has been queued,
-- from %(least)s to %(most)s seconds: each try of a row held for long waits longer, so it is not
-- embedded again every second while it stays held. An entry that transaction holds itself (its
-- capture trigger queued the key anew) is skipped, not waited for: that update makes it ready
-- at its commit; at a rollback the entry comes back when its lease ends.
UPDATE pgembed.queue q
SET next_attempt_at = pg_catalog.now() + pg_catalog.make_interval(secs => LEAST(
        %(most)s::float8,
        GREATEST(%(least)s::float8,
                 EXTRACT(epoch FROM pg_catalog.now() - q.enqueued_at)::float8 / 2))),
    claimed_by = NULL
FROM (SELECT p.ctid
      FROM pgembed.queue p,
           ROWS FROM (pg_catalog.unnest(%(keys)s::text[]), pg_catalog.unnest(%(seqs)s::bigint[])) AS d(key, seq)
      WHERE p.model = %(model)s AND p.key = d.key AND p.seq = d.seq
      FOR UPDATE OF p SKIP LOCKED) AS s
WHERE q.ctid = s.ctid;

-- name: fail_final
-- The last attempt failed: move the key to failures with its error.
WITH moved AS (
    DELETE FROM pgembed.queue
    WHERE model = %(model)s AND key = %(key)s AND seq = %(seq)s AND attempts + 1 >= %(max_attempts)s
    RETURNING model, key, attempts + 1 AS attempts
)
INSERT INTO pgembed.failures (model, key, attempts, error)
SELECT model, key, attempts, %(error)s FROM moved
ON CONFLICT (model, key) DO UPDATE
SET attempts = excluded.attempts, error = excluded.error, failed_at = pg_catalog.now();

-- name: fail_retry
-- Not the last attempt: back off exponentially (2, 4, 8 ... seconds, at most an hour).
UPDATE pgembed.queue
SET attempts = attempts + 1, last_error = %(error)s, claimed_by = NULL,
    next_attempt_at = pg_catalog.now() + pg_catalog.make_interval(secs => least(3600, pg_catalog.power(2::pg_catalog.float8, attempts + 1)))
WHERE model = %(model)s AND key = %(key)s AND seq = %(seq)s;

-- name: retry_failures
-- `pgembed retry`: failed keys back to the queue.
WITH moved AS (
    DELETE FROM pgembed.failures WHERE model = ANY(%(models)s) RETURNING model, key
)
INSERT INTO pgembed.queue (model, key)
SELECT model, key FROM moved
ON CONFLICT (model, key) DO NOTHING;

-- name: forget_failures
-- Keys written at last are no longer failures.
DELETE FROM pgembed.failures f
USING pg_catalog.unnest(%(keys)s::text[]) AS d(key)
WHERE f.model = %(model)s AND f.key = d.key;

-- name: mark_truncated
-- Keys whose text was longer than the model's window (status counts them).
INSERT INTO pgembed.truncated (model, key)
SELECT %(model)s, key FROM pg_catalog.unnest(%(keys)s::text[]) AS d(key)
ON CONFLICT DO NOTHING;

-- name: unmark_truncated
-- A new text of a key may fit: forget an older mark when it is written.
DELETE FROM pgembed.truncated t
USING pg_catalog.unnest(%(keys)s::text[]) AS d(key)
WHERE t.model = %(model)s AND t.key = d.key;

-- name: log_batch
-- One row per written batch: status's rows/s.
INSERT INTO pgembed.batches (model, worker_id, rows, seconds)
VALUES (%(model)s, %(worker)s, %(rows)s, %(seconds)s);

-- name: heartbeat
-- A worker says it is alive, and which models it serves.
INSERT INTO pgembed.workers (id, host, pid, models)
VALUES (%(worker)s, %(host)s, %(pid)s, %(models)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = pg_catalog.now(), models = excluded.models;

-- name: prune
-- Housekeeping a worker does now and then: old batch records and workers long gone.
DELETE FROM pgembed.batches WHERE finished_at < pg_catalog.now() - interval '1 hour';
DELETE FROM pgembed.workers WHERE heartbeat_at < pg_catalog.now() - interval '1 day';

-- name: worker_exit
-- A worker that stops cleanly leaves the list of live workers at once.
DELETE FROM pgembed.workers WHERE id = %(worker)s;

-- name: release_worker
-- After a reconnect: claims this worker held before the fault are handed back at once.
UPDATE pgembed.queue SET next_attempt_at = pg_catalog.now(), claimed_by = NULL
WHERE claimed_by = %(worker)s;

-- name: has_ready
-- Whether a model has a key ready to claim, or one captured in the inbox: a worker loads a
-- model only then (worker.py `load_ready`). Reads queue_ready_idx up to its first entry, and the
-- inbox (no index: each claim empties it into the queue) up to its first entry of the model.
SELECT EXISTS (SELECT FROM pgembed.queue
               WHERE model = %(model)s AND next_attempt_at <= pg_catalog.now())
    OR EXISTS (SELECT FROM pgembed.inbox WHERE model = %(model)s);

-- name: queued_count
-- Keys waiting in the queue or, captured but not yet moved, in the inbox: one count of each (a
-- key inserted again before it was moved counts twice until it is), not a de-duplication of
-- every key, which took a second at a million.
SELECT (SELECT pg_catalog.count(*) FROM pgembed.queue WHERE model = ANY(%(models)s))
     + (SELECT pg_catalog.count(*) FROM pgembed.inbox WHERE model = ANY(%(models)s));

-- name: backlog
-- What `sync --once` leaves behind, by why: keys to retry after a failure; keys leased by a
-- worker whose lease renewer is gone (killed: they are ready again when the lease ends) or still
-- connected (another worker at work); keys whose rows another transaction held at the
-- write-back (postpone: not leased, attempts 0, due later); keys that came in meanwhile
-- (attempts 0, not leased, due).
-- The live workers' session names are read once, not per key.
WITH live AS (
    SELECT coalesce(pg_catalog.array_agg(application_name), '{}') AS names
    FROM pg_catalog.pg_stat_activity WHERE application_name LIKE 'pgembed worker %%'
), q AS (
    SELECT attempts, next_attempt_at,
           claimed_by IS NOT NULL AND next_attempt_at > pg_catalog.now() AS leased,
           claimed_by IS NULL AND attempts = 0 AND next_attempt_at > pg_catalog.now()
               AS postponed,
           coalesce('pgembed worker ' || pg_catalog.right(claimed_by, 8) = ANY (live.names), false)
               AS live
    FROM pgembed.queue, live WHERE model = ANY(%(models)s)
)
SELECT
    pg_catalog.count(*) FILTER (WHERE NOT leased AND attempts > 0) AS retrying,
    pg_catalog.count(*) FILTER (WHERE leased AND NOT live) AS orphaned,
    extract(epoch FROM pg_catalog.max(next_attempt_at) FILTER (WHERE leased AND NOT live)
                       - pg_catalog.now())::float AS orphaned_seconds,
    pg_catalog.count(*) FILTER (WHERE leased AND live) AS leased,
    pg_catalog.count(*) FILTER (WHERE postponed) AS held,
    extract(epoch FROM pg_catalog.max(next_attempt_at) FILTER (WHERE postponed)
                       - pg_catalog.now())::float AS held_seconds,
    pg_catalog.count(*) FILTER (WHERE NOT leased AND NOT postponed AND attempts = 0)
    + (SELECT pg_catalog.count(*) FROM pgembed.inbox WHERE model = ANY(%(models)s)) AS waiting
FROM q;

-- name: name_renewer
-- A worker's lease renewer names its session after the worker (its id's last 8 characters):
-- status and `sync --once` tell a live worker from a killed one by it (lifecycle.sql
-- `live_workers`, `backlog` above).
SELECT pg_catalog.set_config('application_name', 'pgembed worker ' || pg_catalog.right(%(worker)s, 8), false);

-- name: renew
-- A live worker keeps the keys it holds: their lease is pushed forward (never back). Only keys
-- still claimed by it under the claimed seq; rows locked by a write-back are skipped (they are
-- being finished), so a renewal never waits for one or deadlocks with it.
WITH mine AS (
    SELECT q.model, q.key FROM pgembed.queue q
    JOIN ROWS FROM (
        pg_catalog.unnest(%(models)s::text[]),
        pg_catalog.unnest(%(keys)s::text[]),
        pg_catalog.unnest(%(seqs)s::bigint[])
    ) AS d(model, key, seq) ON q.model = d.model AND q.key = d.key AND q.seq = d.seq
    WHERE q.claimed_by = %(worker)s
    FOR UPDATE OF q SKIP LOCKED
)
UPDATE pgembed.queue q
SET next_attempt_at = GREATEST(
    q.next_attempt_at, pg_catalog.now() + pg_catalog.make_interval(secs => %(lease)s)
)
FROM mine
WHERE q.model = mine.model AND q.key = mine.key;

-- name: notify
-- Wake the workers listening on `channel` (naming.CHANNEL): `model` has keys to embed, or is new
-- to them. Sent at commit; only a wake-up: the SKIP LOCKED claim is the source of truth.
SELECT pg_catalog.pg_notify(%(channel)s, %(model)s);

-- name: in_recovery
-- A hot standby (a read-only replica) is in recovery: workers refuse it, searches use it.
SELECT pg_catalog.pg_is_in_recovery();
