-- pgembed 0008: a model may embed several columns of a row as one text (issue 12).
-- `model add --column title --column body` embeds "title\nbody" (a NULL column as empty): the
-- capture triggers watch every column, the md5 guard covers them all, and hybrid search's
-- full-text ranking reads the same text. TG_ARGV[2] of the capture triggers is now the text
-- columns, comma-separated (validated identifiers never hold a comma): a one-column model's
-- triggers stay as they are.

ALTER TABLE pgembed.models ADD COLUMN text_columns text[];
UPDATE pgembed.models SET text_columns = ARRAY[text_column];
ALTER TABLE pgembed.models ALTER COLUMN text_columns SET NOT NULL,
    ADD CONSTRAINT models_text_columns_check
        CHECK (cardinality(text_columns) >= 1 AND text_columns[1] = text_column);

-- The text a model embeds, as an SQL expression over `alias`'s columns: the column itself when
-- there is one (so a full-text index on it still matches), else the columns joined by a newline,
-- a NULL one as empty. || and coalesce(), not concat_ws(): an index expression must be immutable.
-- pgembed/catalog/naming.py (text_expression) writes the same for the sessions' SQL.
CREATE FUNCTION pgembed._text_v1(columns text[], alias text) RETURNS text
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE WHEN cardinality(columns) = 1 THEN format('%s.%I', alias, columns[1])
           ELSE (SELECT string_agg(format('coalesce(%s.%I::pg_catalog.text, '''')', alias, c),
                                   ' || E''\n'' || ' ORDER BY o)
                 FROM unnest(columns) WITH ORDINALITY AS u(c, o)) END
$fn$;

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
    missing text := pgembed._missing_column_v1(TG_RELID, TG_ARGV[0], TG_ARGV[1:1] || texts);
BEGIN
    IF missing IS NOT NULL THEN
        RAISE WARNING '%', missing;
        RETURN NULL;
    END IF;
    EXECUTE format(
        'INSERT INTO pgembed.inbox (model, key, seq)
         SELECT $1, n.%1$I::text, $2 FROM pgembed_new n
         WHERE n.%1$I IS NOT NULL AND pgembed._has_text_v1((%2$s)::text)',
        TG_ARGV[1], pgembed._text_v1(texts, 'n'))
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
    texts text[] := string_to_array(TG_ARGV[2], ',');
    missing text := pgembed._missing_column_v1(
        TG_RELID, TG_ARGV[0], TG_ARGV[1:1] || texts || TG_ARGV[3:3]);
BEGIN
    IF missing IS NOT NULL THEN
        RAISE WARNING '%', missing;
        RETURN NEW;
    END IF;
    EXECUTE format(
        'SELECT ($1).%1$I::text, ($2).%1$I::text, pgembed._has_text_v1((%2$s)::text),
                (%4$s)::text IS DISTINCT FROM (%2$s)::text, ($2).%3$I IS NULL',
        TG_ARGV[1], pgembed._text_v1(texts, '($2)'), TG_ARGV[3],
        pgembed._text_v1(texts, '($1)'))
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
                    row_number() OVER (ORDER BY ts_rank_cd(to_tsvector(''english'', %5$s), q)
                                       DESC, t.%1$I) AS rank
             FROM %3$I.%4$I t, websearch_to_tsquery(''english'', $2) q
             WHERE to_tsvector(''english'', %5$s) @@ q%6$s
             ORDER BY rank
             LIMIT $3)
         SELECT key, coalesce(1.0::float8 / (60 + s.rank), 0) + coalesce(1.0::float8 / (60 + l.rank), 0)
         FROM semantic_rank s FULL JOIN lexical_rank l USING (key)
         ORDER BY 2 DESC, s.rank NULLS LAST, l.rank NULLS LAST
         LIMIT $4',
        m.key_column, m.embedding_column, m.table_schema, m.table_name,
        pgembed._text_v1(m.text_columns, 't'), f.clause,
        pgembed._distance_v1())
        USING query, query_text, greatest(4 * k::bigint, 40), k, f.args;
END
$fn$;

