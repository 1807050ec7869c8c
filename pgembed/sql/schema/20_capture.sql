-- pgembed schema, current definition (2 of 3): the change-capture trigger functions.
-- Not run by `pgembed migrate`, which applies migrations/*.sql (append-only, checksummed); this
-- is the reader's reference, and tests/integration/test_schema.py checks that the migrations
-- produce exactly these objects. Changes go in a new migration under migrations/ and here.
--
-- Each model puts triggers on its source table (pgembed/capture.py) that call these with
-- arguments (model, key column, text column[, embedding column]). User identifiers reach SQL
-- here only through format('%I').

-- Inserted rows, per statement from the transition table pgembed_new: one append to the inbox
-- and one NOTIFY per statement (NULL and '' texts skipped; workers drop whitespace-only ones).
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

-- Updated text (the trigger's WHEN clause checks that it really changed): queue the key, and
-- clear the old vector in the same row write so it is never served for the new text.
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

-- Deleted rows, per statement from the transition table pgembed_old: forget their pending work.
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

-- A truncated source table: forget all of the model's pending work.
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
