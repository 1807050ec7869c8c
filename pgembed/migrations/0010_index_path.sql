-- pgembed 0010: search takes the faster path (issue 15, item 6). On tables of thousands of rows
-- with long texts, whose vectors live in TOAST, the planner chose an exact scan several times
-- slower than the HNSW index (it does not count reading each vector back). Now pgembed.search
-- and the dynamic path without a filter scan a table of fewer than 200 rows exactly (faster
-- there, and exact) and use the index otherwise; with a filter the planner still chooses.
-- Functions only (replaced in place, same signatures) and pgembed.search regenerated: nothing
-- of a user's table changes.

-- Load pgvector so the hnsw.* settings named below are its real ones, not placeholders.
SELECT vector_dims('[0]'::vector);

-- Whether a search of this table without a filter is faster as an exact scan than by its HNSW
-- index: when it has fewer than 200 rows (pg_class.reltuples, kept by VACUUM, ANALYZE and CREATE
-- INDEX; a table never counted, -1, is taken as big). Not left to the planner: its cost of an
-- exact scan leaves out reading each row's vector back from TOAST, where rows with a long text
-- keep it, and it chose a scan several times slower than the index on tables of thousands of
-- such rows (BENCHMARKS.md, "The index or an exact scan").
CREATE FUNCTION pgembed._exact_v1(rel regclass) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT coalesce(c.reltuples >= 0 AND c.reltuples < 200, false)
    FROM pg_class c WHERE c.oid = rel
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
    knob text;
    caller text;
BEGIN
    PERFORM pgembed._check_query_v1(m, query, k);
    f := pgembed._filter_v1(m, filter, 4);
    IF exclude_key IS NOT NULL THEN
        not_self := format(' AND t.%I <> $3::%s', m.key_column,
                          pgembed._column_type_v1(m, m.key_column));
    END IF;
    PERFORM pgembed._use_settings_v1(settings);
    -- Without a filter, the path pgembed.search takes: an exact scan of a tiny table (index scans
    -- off), else the index (sequential scans off). With one, the planner weighs the index against
    -- the rows the filter leaves.
    IF f.clause = '' THEN
        knob := CASE WHEN pgembed._exact_v1(format('%I.%I', m.table_schema, m.table_name)::regclass)
                     THEN 'enable_indexscan' ELSE 'enable_seqscan' END;
        caller := current_setting(knob);
        PERFORM set_config(knob, 'off', true);
    END IF;
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
    IF knob IS NOT NULL THEN  -- no SET clause names it: put back the caller's value
        PERFORM set_config(knob, caller, true);
    END IF;
END
$fn$;

-- Rebuild pgembed.search from pgembed.models (only the triggers below and migrations call it).
CREATE OR REPLACE FUNCTION pgembed._compile_search_v1() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    m pgembed.models;
    branches text := '';
    nearest text;
    exact text;
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
        -- OFFSET 0 keeps the subquery apart, so its rows cannot come in the index's order:
        -- every row is read once, its distance computed once, and the k nearest kept.
        exact := format($exact$
            RETURN QUERY SELECT hits.key, 1 - hits.distance FROM (
                SELECT t.%1$I::text AS key, t.%2$I %5$s query AS distance
                FROM %3$I.%4$I t
                WHERE t.%2$I IS NOT NULL
                OFFSET 0) hits
            ORDER BY hits.distance
            LIMIT k;$exact$,
            m.key_column, m.embedding_column, m.table_schema, m.table_name, distance);
        branches := branches || format($branch$
    WHEN %1$L THEN
        IF %6$s(query) <> %2$s OR k > 100 THEN  -- the dynamic path (or its error)
            RETURN QUERY SELECT * FROM pgembed._nearest_v1(
                model, query, k, NULL, NULL, pgembed._settings_v1(model));
            RETURN;
        END IF;
        -- A tiny table is read whole: faster there than its index, and exact.
        IF pgembed._exact_v1(%7$L) THEN%8$s
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
        -- The index, not an exact scan: the planner's cost of one leaves out reading each vector
        -- back from TOAST (see _exact_v1). Set before every run: a plan is made (or remade after
        -- an ANALYZE) when the statement runs.
        seq := current_setting('enable_seqscan');
        done := set_config('enable_seqscan', 'off', true);
        -- The inner LIMIT is a constant, so the one generic plan is costed for that many rows,
        -- as the raw statement is (a LIMIT parameter would be costed as 10 %% of the table, and
        -- sorting the table would win); the outer LIMIT stops the scan after k rows.
        IF k <= 10 THEN%4$s
        ELSE%5$s
        END IF;
        -- A SET clause restores only the settings it names: put back the caller's (an error
        -- needs nothing, the rollback does it).
        done := set_config('hnsw.iterative_scan', scan, true);
        done := set_config('enable_seqscan', seq, true);
        IF ef IS NOT NULL THEN
            done := set_config('hnsw.ef_search', ef, true);
        END IF;$branch$,
            m.name, m.dimensions, coalesce(m.ef_search, 40)::text,
            replace(nearest, '<limit>', '10'), replace(nearest, '<limit>', '100'), dims,
            format('%I.%I', m.table_schema, m.table_name), exact);
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
    seq text;
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

-- Generate pgembed.search again, for every model.
SELECT pgembed._compile_search_v1();
