-- pgembed 0002: the search helpers pgembed.search, pgembed.similar and pgembed.hybrid_search.
-- Identifiers reach the generated SQL only through format('%I') (or format_type(), from the server);
-- filter values are never SQL text: they travel as one bound jsonb parameter.
-- Everything is SECURITY INVOKER: a caller finds only rows it could SELECT anyway.

-- Iterative index scans (hnsw.iterative_scan) appeared in pgvector 0.8.0.
DO $$
DECLARE
    version text := (SELECT extversion FROM pg_extension WHERE extname = 'vector');
BEGIN
    IF string_to_array(split_part(version, '-', 1), '.')::int[] < '{0,8}' THEN
        RAISE EXCEPTION 'pgembed needs pgvector 0.8.0 or later (installed: %): '
            'ALTER EXTENSION vector UPDATE', version;
    END IF;
END
$$;
-- Load pgvector so the hnsw.* settings named below are its real ones, not placeholders.
SELECT vector_dims('[0]'::vector);

-- The catalog row of a model, or a clear error.
CREATE FUNCTION pgembed._model_v1(model text) RETURNS pgembed.models
LANGUAGE plpgsql STABLE AS $fn$
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

-- The type of a column of the model's table, without its modifier, so a cast to it never
-- truncates (varchar(3)) or rounds (numeric(5,2)) a filter value. NULL when there is no such column.
CREATE FUNCTION pgembed._column_type_v1(m pgembed.models, col text) RETURNS text
LANGUAGE sql STABLE AS $fn$
    SELECT format_type(a.atttypid, NULL)
    FROM pg_attribute a
    WHERE a.attrelid = to_regclass(format('%I.%I', m.table_schema, m.table_name))
      AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped
$fn$;

-- One filter condition on t.<col>. The value is `$<param> -> <slot>`: a bound parameter.
CREATE FUNCTION pgembed._condition_v1(
    col text, typ text, op text, val jsonb, param integer, slot integer
) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $fn$
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

-- A filter ({"col": value, "col": {"$op": value, ...}, ...}) as SQL conditions on alias t,
-- prefixed with AND, plus the jsonb array of values they read from parameter $<param>.
CREATE FUNCTION pgembed._filter_v1(
    m pgembed.models, filter jsonb, param integer, OUT clause text, OUT args jsonb
)
LANGUAGE plpgsql STABLE AS $fn$
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

-- The value a search runs with for one setting: the caller's own (SET, SET LOCAL, ALTER ROLE or
-- DATABASE ... SET, postgresql.conf) wins; else `fallback` (pgembed's default), else what is in force.
-- `defaults` names the settings still at their built-in default (pg_settings.source). A value
-- pgembed itself SET LOCAL for the ORM (remembered in pgembed.applied_*) is not the caller's.
CREATE FUNCTION pgembed._setting_v1(knob text, fallback text, defaults text[]) RETURNS text
LANGUAGE sql STABLE AS $fn$
    SELECT CASE
        WHEN current_setting(knob, true) IS NULL THEN fallback
        WHEN knob = ANY (defaults)
          OR current_setting(knob, true)
             = current_setting('pgembed.applied_' || replace(knob, '.', '_'), true)
            THEN coalesce(fallback, current_setting(knob, true))
        ELSE current_setting(knob, true)
    END
$fn$;

-- {hnsw.ef_search, hnsw.iterative_scan} for a search with this model: the model's ef_search
-- (pgembed.models.ef_search, NULL = pgvector's) and relaxed iterative scans, unless the caller set
-- them. One pass over pg_settings (it lists every setting, so it is the expensive part).
CREATE FUNCTION pgembed._settings_v1(model text) RETURNS text[]
LANGUAGE sql STABLE AS $fn$
    SELECT ARRAY[
        pgembed._setting_v1('hnsw.ef_search', m.ef_search::text, d.names),
        pgembed._setting_v1('hnsw.iterative_scan', 'relaxed_order', d.names)]
    FROM (SELECT coalesce(array_agg(s.name), '{}') AS names
          FROM pg_settings s
          WHERE s.name IN ('hnsw.ef_search', 'hnsw.iterative_scan') AND s.source = 'default') d
    LEFT JOIN pgembed.models m ON m.name = model
$fn$;

CREATE FUNCTION pgembed._use_settings_v1(settings text[]) RETURNS void
LANGUAGE sql AS $fn$
    SELECT set_config('hnsw.ef_search', settings[1], true) WHERE settings[1] IS NOT NULL;
    SELECT set_config('hnsw.iterative_scan', settings[2], true) WHERE settings[2] IS NOT NULL;
$fn$;

-- For a statement pgembed does not wrap (the SQLAlchemy helpers): SET LOCAL the settings for the
-- rest of the transaction, remembering them so a later call can tell them from the caller's own.
CREATE FUNCTION pgembed._apply_settings_v1(model text) RETURNS void
LANGUAGE plpgsql AS $fn$
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

CREATE FUNCTION pgembed._check_query_v1(m pgembed.models, query vector, k integer) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
    IF k IS NULL OR k < 1 THEN
        RAISE EXCEPTION 'k must be a positive number of rows, not %', coalesce(k::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF query IS NULL THEN
        RAISE EXCEPTION 'the query vector is NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF vector_dims(query) <> m.dimensions THEN
        RAISE EXCEPTION 'model % has % dimensions; the query vector has %: embed the query with '
            'the same model', m.name, m.dimensions, vector_dims(query)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- The vector of an existing row, or a clear error when the row is missing (or invisible to the
-- caller) or not embedded yet.
CREATE FUNCTION pgembed._row_vector_v1(model text, row_key text) RETURNS vector
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    m pgembed.models := pgembed._model_v1(model);
    found_row boolean;
    v vector;
BEGIN
    EXECUTE format('SELECT true, t.%1$I FROM %2$I.%3$I t WHERE t.%4$I = $1::%5$s',
                   m.embedding_column, m.table_schema, m.table_name, m.key_column,
                   pgembed._column_type_v1(m, m.key_column))
        INTO found_row, v USING row_key;
    IF found_row IS NULL THEN
        RAISE EXCEPTION 'model %: table %.% has no row with % = %', m.name,
            quote_ident(m.table_schema), quote_ident(m.table_name), quote_ident(m.key_column),
            to_json(row_key)::text USING ERRCODE = 'no_data_found';
    ELSIF v IS NULL THEN
        RAISE EXCEPTION 'model %: row % = % has no vector yet: run `pgembed sync`', m.name,
            quote_ident(m.key_column), to_json(row_key)::text USING ERRCODE = 'no_data_found';
    END IF;
    RETURN v;
END
$fn$;

-- The k nearest rows. `ORDER BY col <=> q LIMIT k` is what lets the planner use the HNSW index;
-- relaxed iterative scans may return those rows slightly out of order, so the materialized CTE is
-- re-sorted (pgvector's recommended form). The SET clauses make the SET LOCALs inside this
-- function end with it, so the caller's settings are untouched afterwards.
CREATE FUNCTION pgembed._nearest_v1(
    model text, query vector, k integer, filter jsonb, exclude_key text, settings text[]
) RETURNS TABLE (key text, similarity double precision)
LANGUAGE plpgsql
SET hnsw.ef_search = 40
SET hnsw.iterative_scan = off
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
             SELECT t.%1$I::text AS key, t.%2$I <=> $1 AS distance
             FROM %3$I.%4$I t
             WHERE t.%2$I IS NOT NULL%5$s%6$s
             ORDER BY t.%2$I <=> $1
             LIMIT $2)
         SELECT hits.key, 1 - hits.distance FROM hits ORDER BY hits.distance',
        m.key_column, m.embedding_column, m.table_schema, m.table_name, not_self, f.clause)
        USING query, k, exclude_key, f.args;
END
$fn$;

-- Reciprocal-rank fusion (constant 60) of the vector ranking and the full-text ranking
-- (to_tsvector('english', text) @@ websearch_to_tsquery, by ts_rank_cd), each cut at
-- greatest(4k, 40) rows. The full-text side uses the GIN index pgembed_<model>_fts.
CREATE FUNCTION pgembed._hybrid_v1(
    model text, query vector, query_text text, k integer, filter jsonb, settings text[]
) RETURNS TABLE (key text, score double precision)
LANGUAGE plpgsql
SET hnsw.ef_search = 40
SET hnsw.iterative_scan = off
AS $fn$
DECLARE
    m pgembed.models := pgembed._model_v1(model);
    f record;
BEGIN
    PERFORM pgembed._check_query_v1(m, query, k);
    IF query_text IS NULL THEN
        RAISE EXCEPTION 'the query text is NULL' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF to_regclass(format('%I.%I', m.table_schema, 'pgembed_' || m.name || '_fts')) IS NULL THEN
        RAISE EXCEPTION 'model % has no full-text index: run `pgembed model fulltext %`',
            m.name, m.name USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    f := pgembed._filter_v1(m, filter, 5);
    PERFORM pgembed._use_settings_v1(settings);
    RETURN QUERY EXECUTE format(
        'WITH semantic AS MATERIALIZED (
             SELECT t.%1$I::text AS key, t.%2$I <=> $1 AS distance
             FROM %3$I.%4$I t
             WHERE t.%2$I IS NOT NULL%6$s
             ORDER BY t.%2$I <=> $1
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
        m.key_column, m.embedding_column, m.table_schema, m.table_name, m.text_column, f.clause)
        USING query, query_text, greatest(4 * k, 40), k, f.args;
END
$fn$;

-- The public helpers. Their arguments are evaluated before _nearest_v1/_hybrid_v1 start, which
-- is what lets _settings_v1 see the caller's settings before those functions' SET clauses apply.
CREATE FUNCTION pgembed.search(
    model text, query vector, k integer DEFAULT 10, filter jsonb DEFAULT NULL
) RETURNS TABLE (key text, similarity double precision)
LANGUAGE sql AS $fn$
    SELECT * FROM pgembed._nearest_v1($1, $2, $3, $4, NULL, pgembed._settings_v1($1))
$fn$;

CREATE FUNCTION pgembed.similar(
    model text, key text, k integer DEFAULT 10, filter jsonb DEFAULT NULL
) RETURNS TABLE (key text, similarity double precision)
LANGUAGE sql AS $fn$
    SELECT * FROM pgembed._nearest_v1(
        $1, pgembed._row_vector_v1($1, $2), $3, $4, $2, pgembed._settings_v1($1))
$fn$;

CREATE FUNCTION pgembed.hybrid_search(
    model text, query vector, query_text text, k integer DEFAULT 10, filter jsonb DEFAULT NULL
) RETURNS TABLE (key text, score double precision)
LANGUAGE sql AS $fn$
    SELECT * FROM pgembed._hybrid_v1($1, $2, $3, $4, $5, pgembed._settings_v1($1))
$fn$;

COMMENT ON FUNCTION pgembed.search(text, vector, integer, jsonb) IS
    'The k rows nearest to a query vector made by the model, nearest first (HNSW index).';
COMMENT ON FUNCTION pgembed.similar(text, text, integer, jsonb) IS
    'The k rows nearest to the row with this key, the row itself excluded.';
COMMENT ON FUNCTION pgembed.hybrid_search(text, vector, text, integer, jsonb) IS
    'Reciprocal-rank fusion of the vector ranking and a full-text ranking of the embedded text.';
