-- pgembed 0014: a queue that stays quick and small at a million keys (issue 24).
-- The claim reads a model's ready keys oldest lease first from this index and stops at its
-- LIMIT, whatever the statistics say (sql/sync.sql `claim`). Built here without CONCURRENTLY:
-- migrate runs in one transaction; a queue is small but during a backlog, when it takes seconds.
CREATE INDEX queue_ready_idx ON pgembed.queue (model, next_attempt_at);

-- Every key passes through the queue (insert, a claim's update, a delete): vacuum it every 10,000
-- dead rows, not at 20 % of its size, so a drained backlog's space is reused and its empty tail
-- given back, and analyze it as often, so no plan meets a million keys it never saw.
ALTER TABLE pgembed.queue SET (
    autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
    autovacuum_vacuum_insert_scale_factor = 0, autovacuum_vacuum_insert_threshold = 10000,
    autovacuum_analyze_scale_factor = 0, autovacuum_analyze_threshold = 10000
);
