-- pgembed 0007: trust. pgembed runs in other people's databases, next to roles it does not trust.
-- - Every function pins search_path to pg_catalog (pgvector's names are written with the
--   extension's schema): a role that can CREATE in a schema on someone's search_path (public,
--   before PostgreSQL 15) can no longer take over a name pgembed calls, and with it the caller.
-- - The capture functions run as their owner (SECURITY DEFINER), so a writing application role
--   needs no privilege on schema pgembed; PUBLIC may no longer call them.
-- - Keys are queued as text in one canonical form (ISO dates, UTC, shortest exact floats),
--   whatever the writer's datestyle, timezone or extra_float_digits.
-- - A key that changes, a vector written by hand, and white-space-only texts (Unicode's white
--   space too) are handled by the capture triggers; the update trigger is made again for every
--   model, and all four fire ALWAYS: also under session_replication_role = replica.
-- - hybrid_search: a huge k no longer overflows an integer; an overlong query text is an error.

-- Whether a text has anything but white space (Unicode's too: NBSP, ideographic space, ...).
-- Operators are qualified: the function is inlined into callers with any search_path.
CREATE FUNCTION pgembed._has_text_v1(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT t OPERATOR(pg_catalog.~)
        '[^[:space:]\u0085\u00a0\u1680\u180e\u2000-\u200b\u2028\u2029\u202f\u205f\u3000\ufeff]'
$fn$;

-- NULL, or why a capture trigger cannot run: a column it names was renamed or dropped. The
-- application's write then goes on without it (a WARNING says so); `pgembed status` marks the
-- model broken. Checked in the catalog, not by catching the error: a subtransaction per row
-- would slow every bulk UPDATE.
CREATE OR REPLACE FUNCTION pgembed._missing_column_v1(rel oid, model text, columns text[]) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT format('pgembed model %s: table %s has no column %s any more (renamed or dropped?), '
                  'so this change was not captured: rename it back, or `pgembed model remove %s`',
                  model, rel::regclass, quote_ident(c), model)
    FROM unnest(columns) AS c
    WHERE NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = rel AND a.attname = c
                                                  AND a.attnum > 0 AND NOT a.attisdropped)
    LIMIT 1
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
    missing text := pgembed._missing_column_v1(TG_RELID, TG_ARGV[0], TG_ARGV[1:2]);
BEGIN
    IF missing IS NOT NULL THEN
        RAISE WARNING '%', missing;
        RETURN NULL;
    END IF;
    EXECUTE format(
        'INSERT INTO pgembed.inbox (model, key, seq)
         SELECT $1, n.%1$I::text, $2 FROM pgembed_new n
         WHERE n.%1$I IS NOT NULL AND pgembed._has_text_v1(n.%2$I::text)',
        TG_ARGV[1], TG_ARGV[2]) USING TG_ARGV[0], pg_current_xact_id()::text::bigint;
    GET DIAGNOSTICS queued = ROW_COUNT;
    IF queued > 0 THEN
        PERFORM pg_notify('pgembed', TG_ARGV[0]);
    END IF;
    RETURN NULL;
END
$fn$;

-- A row whose key, text or vector changed (the trigger's WHEN clause: a vector written by
-- anyone but the sync worker, which says so in pgembed.writing, counts). A changed key forgets the old key's
-- pending work; a new text, a vector written by hand, or a new key of a row still waiting for
-- its vector queues the new key and clears the vector in the same row write, so a vector is
-- never served for a text it was not made from. Arguments: model, key, text, vector column.
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
    missing text := pgembed._missing_column_v1(TG_RELID, TG_ARGV[0], TG_ARGV[1:3]);
BEGIN
    IF missing IS NOT NULL THEN
        RAISE WARNING '%', missing;
        RETURN NEW;
    END IF;
    EXECUTE format(
        'SELECT ($1).%1$I::text, ($2).%1$I::text, pgembed._has_text_v1(($2).%2$I::text),
                ($1).%2$I::text IS DISTINCT FROM ($2).%2$I::text, ($2).%3$I IS NULL',
        TG_ARGV[1], TG_ARGV[2], TG_ARGV[3])
        INTO old_key, new_key, has_text, text_changed, vector_missing
        USING OLD, NEW;
    IF old_key IS DISTINCT FROM new_key THEN
        DELETE FROM pgembed.queue WHERE model = model_name AND key = old_key;
        DELETE FROM pgembed.inbox WHERE model = model_name AND key = old_key;
        DELETE FROM pgembed.truncated WHERE model = model_name AND key = old_key;
        DELETE FROM pgembed.failures WHERE model = model_name AND key = old_key;
    END IF;
    -- The trigger fired: the key, the text or the vector changed. All but a new key of a row
    -- whose vector is still good need a new vector.
    IF text_changed OR old_key IS NOT DISTINCT FROM new_key OR vector_missing THEN
        NEW := jsonb_populate_record(NEW, jsonb_build_object(TG_ARGV[3], NULL));
        IF has_text AND new_key IS NOT NULL THEN
            INSERT INTO pgembed.queue AS q (model, key) VALUES (model_name, new_key)
            ON CONFLICT (model, key) DO UPDATE
                SET seq = excluded.seq, enqueued_at = excluded.enqueued_at, attempts = 0,
                    next_attempt_at = excluded.next_attempt_at, claimed_by = NULL,
                    last_error = NULL;
            PERFORM pg_notify('pgembed', model_name);
        ELSE
            DELETE FROM pgembed.queue WHERE model = model_name AND key = new_key;
        END IF;
    END IF;
    RETURN NEW;
END
$fn$;

-- Deleted rows, per statement from the transition table pgembed_old: forget their pending work.
CREATE OR REPLACE FUNCTION pgembed.capture_delete_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO, MDY' SET intervalstyle = 'postgres' SET timezone = 'UTC'
SET extra_float_digits = 1 SET bytea_output = 'hex'
AS $fn$
DECLARE
    missing text := pgembed._missing_column_v1(TG_RELID, TG_ARGV[0], TG_ARGV[1:1]);
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
    RETURN NULL;
END
$fn$;

-- A truncated source table: forget all of the model's pending work.
CREATE OR REPLACE FUNCTION pgembed.capture_truncate_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    DELETE FROM pgembed.queue WHERE model = TG_ARGV[0];
    DELETE FROM pgembed.inbox WHERE model = TG_ARGV[0];
    DELETE FROM pgembed.truncated WHERE model = TG_ARGV[0];
    DELETE FROM pgembed.failures WHERE model = TG_ARGV[0];
    RETURN NULL;
END
$fn$;

REVOKE EXECUTE ON FUNCTION pgembed.capture_insert_v1(), pgembed.capture_update_v1(),
    pgembed.capture_delete_v1(), pgembed.capture_truncate_v1() FROM PUBLIC;
-- Nor the search compiler's trigger function: attached to another table it would rebuild
-- pgembed.search (as its owner) at every write there.
REVOKE EXECUTE ON FUNCTION pgembed._recompile_search_v1() FROM PUBLIC;

-- Every model's update trigger again, for its new column list and condition (a key change and a
-- vector written by hand fire it; the sync worker's own writes, flagged by pgembed.writing, and a
-- replication apply do not); every capture trigger fires ALWAYS; and the queue is rebuilt in
-- the canonical key form. pgembed/capture.py makes the same triggers for new models.
DO $do$
DECLARE
    m pgembed.models;
    t text;
    event text;
BEGIN
    FOR m IN SELECT * FROM pgembed.models LOOP
        t := pg_catalog.format('%I.%I', m.table_schema, m.table_name);
        -- A table or column already gone: `pgembed status` marks the model broken.
        CONTINUE WHEN pg_catalog.to_regclass(t) IS NULL OR pgembed._missing_column_v1(
            pg_catalog.to_regclass(t), m.name,
            ARRAY[m.key_column, m.text_column, m.embedding_column]) IS NOT NULL;
        EXECUTE pg_catalog.format('DROP TRIGGER IF EXISTS %I ON %s',
                                  'pgembed_' || m.name || '_upd', t);
        EXECUTE pg_catalog.format(
            'CREATE TRIGGER %1$I BEFORE UPDATE OF %3$I, %4$I, %5$I ON %2$s FOR EACH ROW '
            'WHEN (NOT pg_catalog.record_image_eq(ROW(OLD.%3$I, OLD.%4$I), ROW(NEW.%3$I, NEW.%4$I)) '
            'OR (NOT pg_catalog.record_image_eq(ROW(OLD.%5$I), ROW(NEW.%5$I)) '
            'AND pg_catalog.current_setting(''pgembed.writing'', true) IS DISTINCT FROM ''on'' '
            'AND pg_catalog.current_setting(''session_replication_role'') <> ''replica'')) '
            'EXECUTE FUNCTION pgembed.capture_update_v1(%6$L, %3$L, %4$L, %5$L)',
            'pgembed_' || m.name || '_upd', t, m.key_column, m.text_column, m.embedding_column,
            m.name);
        FOREACH event IN ARRAY ARRAY['ins', 'upd', 'del', 'trunc'] LOOP
            EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ALWAYS TRIGGER %I', t,
                                      'pgembed_' || m.name || '_' || event);
        END LOOP;
        -- Keys queued before were written in their writer's datestyle, timezone and float
        -- digits: queue again, in the canonical form, every row still waiting for its vector.
        DELETE FROM pgembed.queue WHERE model = m.name;
        DELETE FROM pgembed.inbox WHERE model = m.name;
        EXECUTE pg_catalog.format(
            'INSERT INTO pgembed.queue (model, key) SELECT %1$L, t.%2$I::pg_catalog.text '
            'FROM %3$s t WHERE t.%2$I IS NOT NULL AND t.%4$I IS NULL '
            'AND pgembed._has_text_v1(t.%5$I::pg_catalog.text)',
            m.name, m.key_column, t, m.embedding_column, m.text_column);
    END LOOP;
END
$do$;

-- pgvector's cosine distance operator, named by the extension's schema: every pgembed function
-- resolves names in pg_catalog only, so nobody's schema on a search_path can take a name over.
CREATE OR REPLACE FUNCTION pgembed._distance_v1() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT format('OPERATOR(%I.<=>)', n.nspname)
    FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
    WHERE e.extname = 'vector'
$fn$;

-- The catalog row of a model, or a clear error.
CREATE OR REPLACE FUNCTION pgembed._model_v1(model text) RETURNS pgembed.models
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    m pgembed.models;
BEGIN
    SELECT * INTO m FROM pgembed.models WHERE name = model;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown model %: see `pgembed model list`', to_json(model)::text
            USING ERRCODE = 'undefined_object';
    END IF;
    RETURN m;
END
$fn$;

-- The type of a column of the model's table without its modifier (a cast to it never truncates).
CREATE OR REPLACE FUNCTION pgembed._column_type_v1(m pgembed.models, col text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT format_type(a.atttypid, NULL)
    FROM pg_attribute a
    WHERE a.attrelid = to_regclass(format('%I.%I', m.table_schema, m.table_name))
      AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped
$fn$;

-- One filter condition on t.<col>; its value is `$<param> -> <slot>`, a bound parameter.
CREATE OR REPLACE FUNCTION pgembed._condition_v1(
    col text, typ text, op text, val jsonb, param integer, slot integer
) RETURNS text
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    value text := format('($%s ->> %s)::%s', param, slot, typ);
BEGIN
    IF op = '$in' THEN
        IF jsonb_typeof(val) <> 'array' THEN
            RAISE EXCEPTION 'filter on %: $in needs a JSON array, not %', to_json(col)::text,
                jsonb_typeof(val) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RETURN format('t.%I = ANY (ARRAY(SELECT jsonb_array_elements_text($%s -> %s))::%s[])',
                      col, param, slot, typ);
    ELSIF op = '$eq' THEN
        RETURN CASE WHEN jsonb_typeof(val) = 'null' THEN format('t.%I IS NULL', col)
                    ELSE format('t.%I = %s', col, value) END;
    ELSIF op = '$ne' THEN  -- like MongoDB's $ne, rows whose column is NULL match
        RETURN format('t.%I IS DISTINCT FROM %s', col, value);
    ELSIF op IN ('$gt', '$gte', '$lt', '$lte') THEN
        IF jsonb_typeof(val) = 'null' THEN
            RAISE EXCEPTION 'filter on %: % needs a value, not null', to_json(col)::text, op
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RETURN format('t.%I %s %s', col,
                      CASE op WHEN '$gt' THEN '>' WHEN '$gte' THEN '>='
                              WHEN '$lt' THEN '<' ELSE '<=' END,
                      value);
    END IF;
    RAISE EXCEPTION 'filter on %: unknown operator % (use $eq, $ne, $gt, $gte, $lt, $lte or $in)',
        to_json(col)::text, to_json(op)::text USING ERRCODE = 'invalid_parameter_value';
END
$fn$;

-- A filter ({"col": value, "col": {"$op": value}, ...}) as " AND ..." conditions plus their values.
CREATE OR REPLACE FUNCTION pgembed._filter_v1(
    m pgembed.models, filter jsonb, param integer, OUT clause text, OUT args jsonb
)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    col text;
    spec jsonb;
    typ text;
    op text;
    val jsonb;
BEGIN
    clause := '';
    args := '[]';
    IF filter IS NULL OR jsonb_typeof(filter) = 'null' THEN
        RETURN;
    END IF;
    IF jsonb_typeof(filter) <> 'object' THEN
        RAISE EXCEPTION 'filter must be a JSON object of column: value or column: {"$op": value}, '
            'not a JSON %', jsonb_typeof(filter) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR col, spec IN SELECT * FROM jsonb_each(filter) LOOP
        typ := pgembed._column_type_v1(m, col);
        IF typ IS NULL THEN
            RAISE EXCEPTION 'filter: table %.% has no column %', quote_ident(m.table_schema),
                quote_ident(m.table_name), to_json(col)::text
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF jsonb_typeof(spec) <> 'object' THEN
            spec := jsonb_build_object('$eq', spec);
        ELSIF spec = '{}' THEN
            RAISE EXCEPTION 'filter on %: empty operator object', to_json(col)::text
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        FOR op, val IN SELECT * FROM jsonb_each(spec) LOOP
            clause := clause || ' AND '
                || pgembed._condition_v1(col, typ, op, val, param, jsonb_array_length(args));
            args := args || jsonb_build_array(val);
        END LOOP;
    END LOOP;
END
$fn$;

-- Whether the caller chose `knob`: its value is neither pgvector's built-in one nor pgembed's own.
CREATE OR REPLACE FUNCTION pgembed._own_setting_v1(knob text, builtin text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT current_setting(knob, true) IS DISTINCT FROM builtin
       AND current_setting(knob, true) IS DISTINCT FROM
           current_setting('pgembed.applied_' || replace(knob, '.', '_'), true)
$fn$;

-- {hnsw.ef_search, hnsw.iterative_scan} for a search with this model: pgembed.ef_search when set,
-- else the caller's own values, else the model's ef_search (NULL: pgvector's) and relaxed scans.
CREATE OR REPLACE FUNCTION pgembed._settings_v1(model text) RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT ARRAY[
        CASE WHEN nullif(current_setting('pgembed.ef_search', true), '') IS NOT NULL
             THEN current_setting('pgembed.ef_search', true)
             WHEN pgembed._own_setting_v1('hnsw.ef_search', '40')
             THEN current_setting('hnsw.ef_search', true)
             ELSE (SELECT m.ef_search::text FROM pgembed.models m WHERE m.name = model) END,
        CASE WHEN pgembed._own_setting_v1('hnsw.iterative_scan', 'off')
             THEN current_setting('hnsw.iterative_scan', true)
             ELSE 'relaxed_order' END]
$fn$;

-- SET LOCAL the two settings _settings_v1 chose (a NULL leaves that one alone).
CREATE OR REPLACE FUNCTION pgembed._use_settings_v1(settings text[]) RETURNS void
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT set_config('hnsw.ef_search', settings[1], true) WHERE settings[1] IS NOT NULL;
    SELECT set_config('hnsw.iterative_scan', settings[2], true) WHERE settings[2] IS NOT NULL;
$fn$;

-- For a statement pgembed does not wrap (the SQLAlchemy helpers): SET LOCAL the settings for the
-- rest of the transaction, remembered in pgembed.applied_* so they are not taken for the caller's.
CREATE OR REPLACE FUNCTION pgembed._apply_settings_v1(model text) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    settings text[] := pgembed._settings_v1(model);
BEGIN
    PERFORM pgembed._model_v1(model);
    PERFORM pgembed._use_settings_v1(settings);
    PERFORM set_config('pgembed.applied_hnsw_ef_search', settings[1], true)
        WHERE settings[1] IS NOT NULL;
    PERFORM set_config('pgembed.applied_hnsw_iterative_scan', settings[2], true)
        WHERE settings[2] IS NOT NULL;
END
$fn$;

-- A clear error for a bad k, a NULL query vector or one of the wrong dimensions.
CREATE OR REPLACE FUNCTION pgembed._check_query_v1(m pgembed.models, query vector, k integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF k IS NULL OR k < 1 THEN
        RAISE EXCEPTION 'k must be a positive number of rows, not %', coalesce(k::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF query IS NULL THEN
        RAISE EXCEPTION 'the query vector is NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_length(query::real[], 1) <> m.dimensions THEN
        RAISE EXCEPTION 'model % has % dimensions; the query vector has %: embed the query with '
            'the same model', m.name, m.dimensions, array_length(query::real[], 1)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- The vector of an existing row, or a clear error when it is missing, invisible or not embedded.
CREATE OR REPLACE FUNCTION pgembed._row_vector_v1(model text, row_key text) RETURNS vector
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO, MDY' SET intervalstyle = 'postgres' SET timezone = 'UTC'
SET extra_float_digits = 1 SET bytea_output = 'hex'
AS $fn$
DECLARE
    m pgembed.models := pgembed._model_v1(model);
    found_row record;
    found integer;
BEGIN
    -- A record, not a variable of type vector: that name would resolve through search_path.
    EXECUTE format('SELECT t.%1$I AS v FROM %2$I.%3$I t WHERE t.%4$I = $1::%5$s',
                   m.embedding_column, m.table_schema, m.table_name, m.key_column,
                   pgembed._column_type_v1(m, m.key_column))
        INTO found_row USING row_key;
    GET DIAGNOSTICS found = ROW_COUNT;
    IF found = 0 THEN
        RAISE EXCEPTION 'model %: table %.% has no row with % = %', m.name,
            quote_ident(m.table_schema), quote_ident(m.table_name), quote_ident(m.key_column),
            to_json(row_key)::text USING ERRCODE = 'no_data_found';
    ELSIF found_row.v IS NULL THEN
        RAISE EXCEPTION 'model %: row % = % has no vector yet: run `pgembed sync`', m.name,
            quote_ident(m.key_column), to_json(row_key)::text USING ERRCODE = 'no_data_found';
    END IF;
    RETURN found_row.v;
END
$fn$;

-- The k nearest rows, by a query planned on every call; its SET clauses end the SET LOCALs with it.
CREATE OR REPLACE FUNCTION pgembed._nearest_v1(
    model text, query vector, k integer, filter jsonb, exclude_key text, settings text[]
) RETURNS TABLE (key text, similarity double precision)
LANGUAGE plpgsql
SET hnsw.ef_search = 40
SET hnsw.iterative_scan = off
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO, MDY' SET intervalstyle = 'postgres' SET timezone = 'UTC'
SET extra_float_digits = 1 SET bytea_output = 'hex'
AS $fn$
DECLARE
    m pgembed.models := pgembed._model_v1(model);
    f record;
    not_self text := '';
BEGIN
    PERFORM pgembed._check_query_v1(m, query, k);
    f := pgembed._filter_v1(m, filter, 4);
    IF exclude_key IS NOT NULL THEN
        not_self := format(' AND t.%I <> $3::%s', m.key_column,
                          pgembed._column_type_v1(m, m.key_column));
    END IF;
    PERFORM pgembed._use_settings_v1(settings);
    RETURN QUERY EXECUTE format(
        'WITH hits AS MATERIALIZED (
             SELECT t.%1$I::text AS key, t.%2$I %7$s $1 AS distance
             FROM %3$I.%4$I t
             WHERE t.%2$I IS NOT NULL%5$s%6$s
             ORDER BY t.%2$I %7$s $1
             LIMIT $2)
         SELECT hits.key, 1 - hits.distance FROM hits ORDER BY hits.distance',
        m.key_column, m.embedding_column, m.table_schema, m.table_name, not_self, f.clause,
        pgembed._distance_v1())
        USING query, k, exclude_key, f.args;
END
$fn$;

-- Reciprocal-rank fusion (constant 60) of the vector ranking and the full-text ranking.
CREATE OR REPLACE FUNCTION pgembed._hybrid_v1(
    model text, query vector, query_text text, k integer, filter jsonb, settings text[]
) RETURNS TABLE (key text, score double precision)
LANGUAGE plpgsql
SET hnsw.ef_search = 40
SET hnsw.iterative_scan = off
SET search_path = pg_catalog, pg_temp
SET datestyle = 'ISO, MDY' SET intervalstyle = 'postgres' SET timezone = 'UTC'
SET extra_float_digits = 1 SET bytea_output = 'hex'
AS $fn$
DECLARE
    m pgembed.models := pgembed._model_v1(model);
    f record;
BEGIN
    PERFORM pgembed._check_query_v1(m, query, k);
    IF query_text IS NULL THEN
        RAISE EXCEPTION 'the query text is NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A longer text would parse into a tsquery deep enough to exhaust the stack.
    IF length(query_text) > 10000 THEN
        RAISE EXCEPTION 'the query text has % characters; at most 10000 are searched',
            length(query_text) USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF to_regclass(format('%I.%I', m.table_schema, 'pgembed_' || m.name || '_fts')) IS NULL THEN
        RAISE EXCEPTION 'model % has no full-text index: run `pgembed model fulltext %`',
            m.name, m.name USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    f := pgembed._filter_v1(m, filter, 5);
    PERFORM pgembed._use_settings_v1(settings);
    RETURN QUERY EXECUTE format(
        'WITH semantic AS MATERIALIZED (
             SELECT t.%1$I::text AS key, t.%2$I %7$s $1 AS distance
             FROM %3$I.%4$I t
             WHERE t.%2$I IS NOT NULL%6$s
             ORDER BY t.%2$I %7$s $1
             LIMIT $3),
         semantic_rank AS (
             SELECT s.key, row_number() OVER (ORDER BY s.distance) AS rank FROM semantic s),
         lexical_rank AS (
             SELECT t.%1$I::text AS key,
                    row_number() OVER (ORDER BY ts_rank_cd(to_tsvector(''english'', t.%5$I), q)
                                       DESC, t.%1$I) AS rank
             FROM %3$I.%4$I t, websearch_to_tsquery(''english'', $2) q
             WHERE to_tsvector(''english'', t.%5$I) @@ q%6$s
             ORDER BY rank
             LIMIT $3)
         SELECT key, coalesce(1.0::float8 / (60 + s.rank), 0) + coalesce(1.0::float8 / (60 + l.rank), 0)
         FROM semantic_rank s FULL JOIN lexical_rank l USING (key)
         ORDER BY 2 DESC, s.rank NULLS LAST, l.rank NULLS LAST
         LIMIT $4',
        m.key_column, m.embedding_column, m.table_schema, m.table_name, m.text_column, f.clause,
        pgembed._distance_v1())
        USING query, query_text, greatest(4 * k::bigint, 40), k, f.args;
END
$fn$;

------------------------------------------------------------------------------------------------
-- The public helpers. Their arguments are evaluated before _nearest_v1/_hybrid_v1 start, which
-- is what lets _settings_v1 see the caller's settings before those functions' SET clauses apply.
-- pgembed.search itself is generated by _compile_search_v1 below.
------------------------------------------------------------------------------------------------

-- The k rows nearest to an existing row, the row itself excluded.
CREATE OR REPLACE FUNCTION pgembed.similar(
    model text, key text, k integer DEFAULT 10, filter jsonb DEFAULT NULL
) RETURNS TABLE (key text, similarity double precision)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT * FROM pgembed._nearest_v1(
        $1, pgembed._row_vector_v1($1, $2), $3, $4, $2, pgembed._settings_v1($1))
$fn$;

-- Vector search fused with full-text search of the embedded text.
CREATE OR REPLACE FUNCTION pgembed.hybrid_search(
    model text, query vector, query_text text, k integer DEFAULT 10, filter jsonb DEFAULT NULL
) RETURNS TABLE (key text, score double precision)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT * FROM pgembed._hybrid_v1($1, $2, $3, $4, $5, pgembed._settings_v1($1))
$fn$;

------------------------------------------------------------------------------------------------
-- The compiled path: pgembed.search, generated from the catalog.
--
-- _compile_search_v1 (re)creates pgembed.search with one branch per model whose query names the
-- model's table and columns, so PL/pgSQL prepares it once per session and plan_cache_mode keeps
-- one generic plan. Searches with a filter, k > 100, a query of other dimensions, an unknown
-- model and every error go to the dynamic path (_nearest_v1).
--
-- The template is the compiler's three format() strings, from the inside out:
--   $nearest$  one model's query.      %1$I key column, %2$I embedding column, %3$I.%4$I table,
--              %5$s pgvector's <=> by its schema; <limit> becomes 10 (k <= 10) or 100
--              (10 < k <= 100): a constant the generic plan is costed for, as the raw
--              statement is.
--   $branch$   one model's WHEN arm.   %1$L model name, %2$s dimensions, %3$L its ef_search
--              (coalesce(models.ef_search, 40)), %4$s/%5$s $nearest$ with LIMIT 10/100,
--              %6$s pgvector's vector_dims by its schema.
--   $body$     the function body.      %s: every model's $branch$, in name order (or a
--              `WHEN NULL THEN NULL;` when there is no model).
-- The outer format() adds the signature (%s: the vector type, schema-qualified), the settings
-- every pgembed function pins (search_path; how keys are written as text) and the body
-- as a %L literal. tests/integration/snapshots/search_sample.sql shows what it generates for one
-- model, search_empty.sql for none.
------------------------------------------------------------------------------------------------

-- Rebuild pgembed.search from pgembed.models (only the triggers below and migrations call it).
CREATE OR REPLACE FUNCTION pgembed._compile_search_v1() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    m pgembed.models;
    branches text := '';
    nearest text;
    vector_type text;
    distance text;
    dims text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        -- An older snapshot could miss a model another transaction just changed.
        RAISE EXCEPTION 'change pgembed.models at READ COMMITTED isolation, not %',
            current_setting('transaction_isolation')
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- Concurrent rebuilds would fail with "tuple concurrently updated": one at a time. Taken
    -- at commit (the trigger is deferred), after every other lock of the transaction.
    PERFORM pg_advisory_xact_lock(hashtext('pgembed._compile_search_v1'));
    -- pgvector's names, by the extension's schema: the generated function resolves in pg_catalog.
    SELECT format('%I.vector', n.nspname), format('OPERATOR(%I.<=>)', n.nspname),
           format('%I.vector_dims', n.nspname)
    INTO vector_type, distance, dims
    FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector';
    FOR m IN SELECT * FROM pgembed.models ORDER BY name LOOP
        -- The statement for one LIMIT constant (validated identifiers cannot contain '<').
        nearest := format($nearest$
            RETURN QUERY SELECT hits.key, hits.similarity FROM (
                SELECT t.%1$I::text AS key, 1 - (t.%2$I %5$s query) AS similarity
                FROM %3$I.%4$I t
                WHERE t.%2$I IS NOT NULL
                ORDER BY t.%2$I %5$s query
                LIMIT <limit>) hits
            LIMIT k;$nearest$,
            m.key_column, m.embedding_column, m.table_schema, m.table_name, distance);
        branches := branches || format($branch$
    WHEN %1$L THEN
        IF %6$s(query) <> %2$s OR k > 100 THEN  -- the dynamic path (or its error)
            RETURN QUERY SELECT * FROM pgembed._nearest_v1(
                model, query, k, NULL, NULL, pgembed._settings_v1(model));
            RETURN;
        END IF;
        -- ef_search: pgembed.ef_search, else the caller's own value, else the model's. Changed
        -- (and put back) only when it differs from the value in force: usually it does not.
        -- Assignments, not PERFORM: PL/pgSQL evaluates a lone expression without the executor.
        IF nullif(current_setting('pgembed.ef_search', true), '') IS NOT NULL THEN
            ef := current_setting('hnsw.ef_search');
            done := set_config('hnsw.ef_search', current_setting('pgembed.ef_search'), true);
        ELSIF current_setting('hnsw.ef_search') <> %3$L
              AND NOT pgembed._own_setting_v1('hnsw.ef_search', '40') THEN
            ef := current_setting('hnsw.ef_search');
            done := set_config('hnsw.ef_search', %3$L, true);
        END IF;
        -- Strict order: the index returns the rows nearest first, nothing to re-sort, and
        -- still k rows when dead tuples or row-level security hide some of the first ef_search.
        scan := current_setting('hnsw.iterative_scan');
        done := set_config('hnsw.iterative_scan', 'strict_order', true);
        -- The inner LIMIT is a constant, so the one generic plan is costed for that many rows,
        -- as the raw statement is (a LIMIT parameter would be costed as 10 %% of the table, and
        -- sorting the table would win); the outer LIMIT stops the scan after k rows.
        IF k <= 10 THEN%4$s
        ELSE%5$s
        END IF;
        -- A SET clause restores only the settings it names: put back the caller's (an error
        -- needs nothing, the rollback does it).
        done := set_config('hnsw.iterative_scan', scan, true);
        IF ef IS NOT NULL THEN
            done := set_config('hnsw.ef_search', ef, true);
        END IF;$branch$,
            m.name, m.dimensions, coalesce(m.ef_search, 40)::text,
            replace(nearest, '<limit>', '10'), replace(nearest, '<limit>', '100'), dims);
    END LOOP;
    IF branches = '' THEN  -- PL/pgSQL's CASE needs a WHEN
        branches := E'\n    WHEN NULL THEN NULL;';
    END IF;
    -- The body is a %L literal, not dollar-quoted text: an identifier cannot end it early.
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION pgembed.search('
        'model text, query %s, k integer DEFAULT 10, filter jsonb DEFAULT NULL) '
        'RETURNS TABLE (key text, similarity double precision) LANGUAGE plpgsql '
        'SET plan_cache_mode = force_generic_plan SET search_path = pg_catalog, pg_temp '
        'SET datestyle = ''ISO, MDY'' SET intervalstyle = postgres SET timezone = UTC '
        'SET extra_float_digits = 1 SET bytea_output = hex AS %L',
        vector_type, format($body$
-- A table's own columns may be named like these variables: they are always written t.<column>.
#variable_conflict use_variable
DECLARE
    ef text;
    scan text;
    done text;
BEGIN
    IF (filter IS NOT NULL AND jsonb_typeof(filter) <> 'null') OR k IS NULL OR k < 1
       OR query IS NULL THEN
        RETURN QUERY SELECT * FROM pgembed._nearest_v1(
            model, query, k, filter, NULL, pgembed._settings_v1(model));
        RETURN;
    END IF;
    CASE model%s
    ELSE  -- not a model: the dynamic path says so
        RETURN QUERY SELECT * FROM pgembed._nearest_v1(
            model, query, k, NULL, NULL, pgembed._settings_v1(model));
    END CASE;
END
$body$, branches));
END
$fn$;

-- Generate pgembed.search again, with the settings pinned and pgvector's names qualified.
SELECT pgembed._compile_search_v1();
