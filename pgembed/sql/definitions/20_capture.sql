-- pgembed's SQL definitions (1 of 3): the change-capture trigger functions.
-- The one definition of each function, trigger function, trigger on pgembed's tables and their
-- grants. `pgembed migrate` re-applies every file of sql/definitions/ in name order, in one
-- transaction, after the run-once migrations (migrations/*.sql: tables, columns, data moves,
-- drops), whenever one of them changed or a migration was applied; pgembed.definitions records
-- each file's sha256. So every statement here must be safe to run again: CREATE OR REPLACE,
-- DROP ... IF EXISTS then CREATE, GRANT/REVOKE, COMMENT. A change that OR REPLACE cannot make
-- (a new return type, a renamed or removed argument) drops the old function in a new migration
-- first; a function that is no longer wanted is dropped by a migration and deleted here.
--
-- Each model puts triggers on its source table (pgembed/capture.py) that call these with
-- arguments (model, key column, text columns comma-separated[, embedding column]). User identifiers reach SQL
-- here only through format('%I'); only pgembed's own triggers pass them (PUBLIC may not call
-- these functions).

-- Whether a text has anything visible: not only white space (Unicode's too: NBSP, ideographic
-- space, ...) and characters that show nothing: zero-width and bidi format characters (U+200B-F,
-- U+202A-E, U+2060-F, U+FEFF), the soft hyphen, fillers that render blank (Hangul U+115F, U+1160,
-- U+3164, U+FFA0; Braille blank U+2800), variation selectors, tags. The one judge of a text,
-- the SQL of capture, claims and counts all call it: a text it refuses is never queued, like NULL.
-- Operators are qualified: the function is inlined into callers with any search_path.
CREATE OR REPLACE FUNCTION pgembed._has_text_v1(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT t OPERATOR(pg_catalog.~)
        ('[^[:space:]\u0085\u00a0\u00ad\u034f\u061c\u115f\u1160\u1680\u17b4\u17b5'
         '\u180b-\u180f\u2000-\u200f\u2028-\u202f\u205f-\u206f\u2800\u3000\u3164'
         '\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb\U0001bca0-\U0001bca3\U0001d173-\U0001d17a'
         '\U000e0000-\U000e007f\U000e0100-\U000e01ef]')
$fn$;

-- The text a model embeds, as an SQL expression over `alias`'s columns: the column itself when
-- there is one (so a full-text index on it still matches), else the columns joined by a newline,
-- a NULL one as empty. || and coalesce(), not concat_ws(): an index expression must be immutable.
-- pgembed/catalog/naming.py (text_expression) writes the same for the sessions' SQL.
CREATE OR REPLACE FUNCTION pgembed._text_v1(columns text[], alias text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE WHEN cardinality(columns) = 1 THEN format('%s.%I', alias, columns[1])
           ELSE (SELECT string_agg(format('coalesce(%s.%I::pg_catalog.text, '''')', alias, c),
                                   ' || E''\n'' || ' ORDER BY o)
                 FROM unnest(columns) WITH ORDINALITY AS u(c, o)) END
$fn$;

-- NULL, or why a capture trigger cannot run: a column it names was renamed or dropped, or its
-- type belongs to a role that is not a superuser (a composite, a domain of a user's), whose cast
-- to text would run as the role that ran `migrate`, so nothing of it is cast (catalog.sql's
-- untrusted_columns applies the same rule at `model add`, in `status` and the daemon). The
-- application's write then goes on without it (a WARNING says so); `pgembed status` marks the
-- model broken. Checked in the catalog, not by catching the error: a subtransaction per row
-- would slow every bulk UPDATE. Only the key and vector columns are needed to capture: with a
-- text column missing the triggers queue the row by key (its text is judged when it is claimed,
-- once the column is back), so a rename and its undoing lose no change.
CREATE OR REPLACE FUNCTION pgembed._missing_column_v1(rel oid, model text, columns text[]) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE WHEN a.typ IS NULL
                THEN format('pgembed model %s: table %s has no column %s any more (renamed or '
                            'dropped?), so this change was not captured: rename it back, or '
                            '`pgembed model remove %s`', model, rel::regclass, quote_ident(c),
                            model)
                ELSE format('pgembed model %s: column %s of table %s has type %s, which a '
                            'non-superuser owns, so this change was not captured (its casts '
                            'would run as pgembed''s owner): `pgembed model remove %s`',
                            model, quote_ident(c), rel::regclass, format_type(a.typ, NULL),
                            model) END
    FROM unnest(columns) AS c
    LEFT JOIN LATERAL (
        SELECT a.atttypid AS typ,
               (SELECT t.typowner FROM pg_type t WHERE t.oid = a.atttypid) AS owner
        FROM pg_attribute a
        WHERE a.attrelid = rel AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped
    ) a ON true
    -- This runs for every row updated: built-in types belong to the bootstrap superuser (oid
    -- 10), so pg_roles is read only for other types (an extension's belong to a superuser).
    WHERE a.typ IS NULL
       OR (a.owner <> 10
           AND NOT EXISTS (SELECT FROM pg_roles r WHERE r.oid = a.owner AND r.rolsuper))
    LIMIT 1
$fn$;

-- pgembed's own table by this name (a quoted, qualified name), else NULL: a plain table owned by
-- the owner of pgembed's catalog, the role the capture functions run as (`model add` gives it
-- that owner). Anything else by that name, a view or another role's table put there after
-- pgembed's was dropped, could run that role's code (a trigger, a rule, a function in a view) as
-- whoever writes or reads the chunks. Not the owner of schema pgembed: `ALTER SCHEMA pgembed
-- OWNER TO` moves neither the catalog nor the functions, and a chunk table of the new schema
-- owner's would run its triggers as the functions' owner.
CREATE OR REPLACE FUNCTION pgembed._own_chunks_v1(chunks text) RETURNS regclass
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT c.oid::regclass FROM pg_class c
    WHERE c.oid = to_regclass(chunks) AND c.relkind = 'r'
      AND c.relowner = (SELECT k.relowner FROM pg_class k WHERE k.oid = 'pgembed.models'::regclass)
$fn$;

-- A chunked model's chunk table, named by the trigger's argument (NULL: the model does not chunk).
-- One that is gone (dropped by hand) or not pgembed's only warns: the application's write goes on.
CREATE OR REPLACE FUNCTION pgembed._chunk_table_v1(model text, chunks text) RETURNS regclass
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    found regclass := pgembed._own_chunks_v1(chunks);
BEGIN
    IF chunks IS NOT NULL AND found IS NULL THEN
        RAISE WARNING 'pgembed model %: its chunk table % is gone or not pgembed''s, so chunks '
            'were not cleaned up: run `pgembed reindex %`', model, chunks, model;
    END IF;
    RETURN found;
END
$fn$;

-- The capture functions run as their owner (the role that ran `pgembed migrate`), so a writing
-- role needs no privilege on schema pgembed, and cannot read or change its queues otherwise.
-- They are not executable by PUBLIC: only pgembed's own triggers, made by `model add`, call
-- them. Every one pins search_path, and the settings that change how a key is written as text
-- (keys are queued as text in this canonical form, whatever the writer's session settings).

-- Inserted rows, per statement from the transition table pgembed_new: one append to the inbox
-- and one NOTIFY per statement. NULL keys and texts with nothing but white space are skipped.
CREATE OR REPLACE FUNCTION pgembed.capture_insert_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO, MDY' SET intervalstyle = 'postgres' SET timezone = 'UTC'
SET extra_float_digits = 1 SET bytea_output = 'hex'
AS $fn$
DECLARE
    queued bigint;
    texts text[] := string_to_array(TG_ARGV[2], ',');
    missing text := pgembed._missing_column_v1(TG_RELID, TG_ARGV[0], TG_ARGV[1:1]);
    texts_missing boolean := pgembed._missing_column_v1(TG_RELID, TG_ARGV[0], texts) IS NOT NULL;
BEGIN
    IF missing IS NOT NULL THEN
        RAISE WARNING '%', missing;
        RETURN NULL;
    END IF;
    EXECUTE format(
        'INSERT INTO pgembed.inbox (model, key, seq)
         SELECT $1, n.%1$I::text, $2 FROM pgembed_new n
         WHERE n.%1$I IS NOT NULL AND %2$s',
        TG_ARGV[1], CASE WHEN texts_missing THEN 'true'  -- judged at the claim
                         ELSE format('pgembed._has_text_v1((%s)::text)',
                                     pgembed._text_v1(texts, 'n')) END)
        USING TG_ARGV[0], pg_current_xact_id()::text::bigint;
    GET DIAGNOSTICS queued = ROW_COUNT;
    IF queued > 0 THEN
        PERFORM pg_notify('pgembed', TG_ARGV[0]);
    END IF;
    RETURN NULL;
END
$fn$;

-- A row whose key, text (any of its columns) or vector changed (the trigger's WHEN clause: a vector written by
-- anyone but the sync worker, which says so in pgembed.writing, counts). A changed key forgets the old key's
-- pending work; a new text, a vector written by hand, or a new key of a row still waiting for
-- its vector queues the new key and clears the vector in the same row write, so a vector is
-- never served for a text it was not made from. A chunked model (a fifth argument: its chunk
-- table) re-embeds a row under a new key too, and a cleared vector takes the old key's chunks
-- along. Arguments: model, key, text, vector column[, chunk table].
CREATE OR REPLACE FUNCTION pgembed.capture_update_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO, MDY' SET intervalstyle = 'postgres' SET timezone = 'UTC'
SET extra_float_digits = 1 SET bytea_output = 'hex'
AS $fn$
DECLARE
    model_name text := TG_ARGV[0];
    old_key text;
    new_key text;
    has_text boolean;
    text_changed boolean;
    vector_missing boolean;
    key_type oid;
    texts text[] := string_to_array(TG_ARGV[2], ',');
    missing text := pgembed._missing_column_v1(TG_RELID, TG_ARGV[0], TG_ARGV[1:1] || TG_ARGV[3:3]);
    texts_missing boolean := pgembed._missing_column_v1(TG_RELID, TG_ARGV[0], texts) IS NOT NULL;
    -- Only a chunked model's triggers pay for the lookup: this runs for every row updated.
    chunks regclass := CASE WHEN TG_NARGS > 4
                            THEN pgembed._chunk_table_v1(TG_ARGV[0], TG_ARGV[4]) END;
BEGIN
    IF missing IS NOT NULL THEN
        RAISE WARNING '%', missing;
        RETURN NEW;
    END IF;
    -- A text column missing: the text may have changed and is judged at the claim.
    EXECUTE format(
        'SELECT ($1).%1$I::text, ($2).%1$I::text, %2$s, %4$s, ($2).%3$I IS NULL, '
        'pg_typeof(($1).%1$I)::oid',
        TG_ARGV[1],
        CASE WHEN texts_missing THEN 'true'
             ELSE format('pgembed._has_text_v1((%s)::text)', pgembed._text_v1(texts, '($2)')) END,
        TG_ARGV[3],
        CASE WHEN texts_missing THEN 'true'
             ELSE format('(%s)::text IS DISTINCT FROM (%s)::text',
                         pgembed._text_v1(texts, '($1)'), pgembed._text_v1(texts, '($2)')) END)
        INTO old_key, new_key, has_text, text_changed, vector_missing, key_type
        USING OLD, NEW;
    IF old_key IS DISTINCT FROM new_key THEN
        DELETE FROM pgembed.queue WHERE model = model_name AND key = old_key;
        DELETE FROM pgembed.inbox WHERE model = model_name AND key = old_key;
        DELETE FROM pgembed.truncated WHERE model = model_name AND key = old_key;
        DELETE FROM pgembed.failures WHERE model = model_name AND key = old_key;
    END IF;
    -- The trigger fired: the key, the text or the vector changed. All but a new key of a row
    -- whose vector is still good need a new vector.
    IF text_changed OR old_key IS NOT DISTINCT FROM new_key OR vector_missing
       OR chunks IS NOT NULL THEN
        NEW := jsonb_populate_record(NEW, jsonb_build_object(TG_ARGV[3], NULL));
        IF chunks IS NOT NULL THEN
            -- By the key type's `=` (_key_v1), which the chunk table's index answers. A type
            -- made by initdb (an OID below 16384) is compared by the `=` this function's
            -- search_path finds, pg_catalog's, without _key_v1's catalog reads for every row.
            EXECUTE format('DELETE FROM %s c WHERE %s', chunks,
                           CASE WHEN key_type < 16384
                                THEN format('c.key = ($1).%I', TG_ARGV[1])
                                ELSE pgembed._key_equal_v1(TG_TABLE_SCHEMA, TG_TABLE_NAME,
                                                           TG_ARGV[1], 'c.key',
                                                           format('($1).%I', TG_ARGV[1])) END)
                USING OLD;
        END IF;
        IF has_text AND new_key IS NOT NULL THEN
            INSERT INTO pgembed.queue AS q (model, key) VALUES (model_name, new_key)
            ON CONFLICT (model, key) DO UPDATE
                SET seq = excluded.seq, enqueued_at = excluded.enqueued_at, attempts = 0,
                    next_attempt_at = excluded.next_attempt_at, claimed_by = NULL,
                    last_error = NULL;
            PERFORM pg_notify('pgembed', model_name);
        ELSE  -- nothing left to embed: nor to retry, nor cut
            DELETE FROM pgembed.queue WHERE model = model_name AND key = new_key;
            DELETE FROM pgembed.truncated WHERE model = model_name AND key = new_key;
            DELETE FROM pgembed.failures WHERE model = model_name AND key = new_key;
        END IF;
    END IF;
    RETURN NEW;
END
$fn$;

-- Deleted rows, per statement from the transition table pgembed_old: forget their pending work
-- (and a chunked model's chunks). Arguments: model, key, text[, chunk table].
CREATE OR REPLACE FUNCTION pgembed.capture_delete_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO, MDY' SET intervalstyle = 'postgres' SET timezone = 'UTC'
SET extra_float_digits = 1 SET bytea_output = 'hex'
AS $fn$
DECLARE
    missing text := pgembed._missing_column_v1(TG_RELID, TG_ARGV[0], TG_ARGV[1:1]);
    chunks regclass := pgembed._chunk_table_v1(TG_ARGV[0], TG_ARGV[3]);
BEGIN
    IF missing IS NOT NULL THEN
        RAISE WARNING '%', missing;
        RETURN NULL;
    END IF;
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
    IF chunks IS NOT NULL THEN
        EXECUTE format('DELETE FROM %s c USING pgembed_old o WHERE %s', chunks,
                       pgembed._key_equal_v1(TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[1],
                                             'c.key', format('o.%I', TG_ARGV[1])));
    END IF;
    RETURN NULL;
END
$fn$;

-- A truncated source table: forget all of the model's pending work, and truncate its chunks.
CREATE OR REPLACE FUNCTION pgembed.capture_truncate_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    chunks regclass := pgembed._chunk_table_v1(TG_ARGV[0], TG_ARGV[3]);
BEGIN
    IF chunks IS NOT NULL THEN
        EXECUTE format('TRUNCATE %s', chunks);
    END IF;
    DELETE FROM pgembed.queue WHERE model = TG_ARGV[0];
    DELETE FROM pgembed.inbox WHERE model = TG_ARGV[0];
    DELETE FROM pgembed.truncated WHERE model = TG_ARGV[0];
    DELETE FROM pgembed.failures WHERE model = TG_ARGV[0];
    RETURN NULL;
END
$fn$;

-- A vector an INSERT brings or an UPDATE writes, and any write of the vector column under
-- pgembed.writing (its trigger's WHEN; not under a replication apply). The flag says the sync
-- worker writes, or the table's owner loads vectors made elsewhere: it is honoured for a member
-- of the table's owner (a superuser is one; the worker writes as the owner, or as itself, a
-- member of pgembed_daemon, when the owner is a superuser) or of pgembed_daemon only; for
-- another role the statement fails. Else a writer could make a vector stick (an audit's forged
-- vectors on blank rows were served for ever), or clear one for good (the update trigger skips
-- flagged vector writes, so its row was never queued). Without the flag, an INSERT's vector is
-- cleared in the row write (its key is queued by the insert trigger when it has text, so the row
-- gets the vector of its own text, and a row without text none); an UPDATE's is the update
-- trigger's to clear and queue. A vector column renamed since: a warning, as the other capture
-- triggers give. Arguments: model, vector column. Run as the writer, to know who writes: it
-- reads pg_catalog only, since a writer has no USAGE on schema pgembed; jsonb_populate_record
-- runs no type's input function but the vector's (NULL), the other columns are NEW's as they are.
CREATE OR REPLACE FUNCTION pgembed.capture_insert_vector_v1() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF current_setting('pgembed.writing', true) = 'on' THEN
        IF pg_has_role(current_user, (SELECT c.relowner FROM pg_class c WHERE c.oid = TG_RELID),
                       'MEMBER')
           OR coalesce(pg_has_role(current_user, to_regrole('pgembed_daemon'), 'MEMBER'), false)
        THEN
            RETURN NEW;
        END IF;
        -- An INSERT without a vector: nothing to refuse (the flag lasts the worker's whole
        -- transaction, in which the owner's trigger may insert into another watched table).
        IF TG_OP = 'INSERT'
           AND coalesce(to_jsonb(NEW) -> TG_ARGV[1], 'null'::jsonb) = 'null'::jsonb THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'pgembed model %: role % may not write vectors into % with '
            'pgembed.writing = on (the sync worker''s flag, and its owner''s): write the rows '
            'without vectors, pgembed embeds them', TG_ARGV[0], current_user, TG_RELID::regclass
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF TG_OP = 'UPDATE' THEN
        RETURN NEW;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute a
                   WHERE a.attrelid = TG_RELID AND a.attname = TG_ARGV[1] AND a.attnum > 0
                     AND NOT a.attisdropped) THEN
        RAISE WARNING 'pgembed model %: table % has no column % any more (renamed or dropped?), '
            'so this change was not captured: rename it back, or `pgembed model remove %`',
            TG_ARGV[0], TG_RELID::regclass, quote_ident(TG_ARGV[1]), TG_ARGV[0];
        RETURN NEW;
    END IF;
    NEW := jsonb_populate_record(NEW, jsonb_build_object(TG_ARGV[1], NULL));
    RETURN NEW;
END
$fn$;

REVOKE EXECUTE ON FUNCTION pgembed.capture_insert_v1(), pgembed.capture_update_v1(),
    pgembed.capture_delete_v1(), pgembed.capture_truncate_v1(),
    pgembed.capture_insert_vector_v1() FROM PUBLIC;

