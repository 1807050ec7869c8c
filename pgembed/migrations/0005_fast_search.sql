-- pgembed 0005: pgembed.search at the cost of the raw statement.
-- Two costs dominated a call of 0002's helper: reading pg_settings (it builds every setting's
-- row, ~1 ms) to tell the caller's hnsw.* settings from the defaults, and planning the dynamic
-- query anew on every call. Now a setting counts as the caller's when its value differs from
-- pgvector's built-in one (or from the value pgembed itself SET LOCAL for the ORM), and
-- pgembed.search is generated from the catalog with one static, plan-cached query per model,
-- rebuilt by a trigger whenever the models that decide that query change. Searches with a filter,
-- and every error, still take 0002's dynamic path.

-- Whether the caller chose `knob`: its value is neither pgvector's built-in one nor the one
-- pgembed SET LOCAL for an ORM statement (remembered in pgembed.applied_*).
CREATE FUNCTION pgembed._own_setting_v1(knob text, builtin text) RETURNS boolean
LANGUAGE sql STABLE AS $fn$
    SELECT current_setting(knob, true) IS DISTINCT FROM builtin
       AND current_setting(knob, true) IS DISTINCT FROM
           current_setting('pgembed.applied_' || replace(knob, '.', '_'), true)
$fn$;

-- {hnsw.ef_search, hnsw.iterative_scan} for a search with this model: pgembed.ef_search when set
-- (the way to ask for exactly 40, and what `pgembed query --ef-search` sets), else the caller's
-- own values, else the model's ef_search (NULL: leave pgvector's) and relaxed iterative scans.
CREATE OR REPLACE FUNCTION pgembed._settings_v1(model text) RETURNS text[]
LANGUAGE sql STABLE AS $fn$
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

DROP FUNCTION pgembed._setting_v1(text, text, text[]);

-- Rebuild pgembed.search from the catalog. Each model gets a branch whose query names its table
-- and columns (quoted with %I), so PL/pgSQL prepares it once per session; plan_cache_mode keeps
-- that one generic plan instead of replanning for every query vector. A function's SET clause
-- only restores the settings it names, so the branch puts back the two it changes itself.
CREATE FUNCTION pgembed._compile_search_v1() RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    m pgembed.models;
    branches text := '';
    nearest text;
    vector_type text;
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
    SELECT format('%I.vector', n.nspname) INTO vector_type
    FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector';
    FOR m IN SELECT * FROM pgembed.models ORDER BY name LOOP
        -- The statement for one LIMIT constant (validated identifiers cannot contain '<').
        nearest := format($nearest$
            RETURN QUERY SELECT hits.key, hits.similarity FROM (
                SELECT t.%1$I::text AS key, 1 - (t.%2$I <=> query) AS similarity
                FROM %3$I.%4$I t
                WHERE t.%2$I IS NOT NULL
                ORDER BY t.%2$I <=> query
                LIMIT <limit>) hits
            LIMIT k;$nearest$,
            m.key_column, m.embedding_column, m.table_schema, m.table_name);
        branches := branches || format($branch$
    WHEN %1$L THEN
        IF vector_dims(query) <> %2$s OR k > 100 THEN  -- the dynamic path (or its error)
            RETURN QUERY SELECT * FROM pgembed._nearest_v1(
                model, query, k, NULL, NULL, pgembed._settings_v1(model));
            RETURN;
        END IF;
        scan := current_setting('hnsw.iterative_scan');
        ef := current_setting('hnsw.ef_search');
        -- Strict order: the index returns the rows nearest first, nothing to re-sort, and
        -- still k rows when dead tuples or row-level security hide some of the first ef_search.
        -- (One expression per statement: PL/pgSQL evaluates those without the executor.)
        PERFORM set_config('hnsw.iterative_scan', 'strict_order', true);
        IF nullif(current_setting('pgembed.ef_search', true), '') IS NOT NULL THEN
            PERFORM set_config('hnsw.ef_search', current_setting('pgembed.ef_search'), true);
        ELSIF NOT pgembed._own_setting_v1('hnsw.ef_search', '40') THEN
            PERFORM set_config('hnsw.ef_search', %3$L, true);
        END IF;
        -- The inner LIMIT is a constant, so the one generic plan is costed for that many rows,
        -- as the raw statement is (a LIMIT parameter would be costed as 10 %% of the table, and
        -- sorting the table would win); the outer LIMIT stops the scan after k rows.
        IF k <= 10 THEN%4$s
        ELSE%5$s
        END IF;
        -- A SET clause restores only the settings it names: put back the caller's (an error
        -- needs nothing, the rollback does it).
        PERFORM set_config('hnsw.iterative_scan', scan, true);
        PERFORM set_config('hnsw.ef_search', ef, true);$branch$,
            m.name, m.dimensions, coalesce(m.ef_search, 40)::text,
            replace(nearest, '<limit>', '10'), replace(nearest, '<limit>', '100'));
    END LOOP;
    IF branches = '' THEN  -- PL/pgSQL's CASE needs a WHEN
        branches := E'\n    WHEN NULL THEN NULL;';
    END IF;
    -- The body is a %L literal, not dollar-quoted text: an identifier cannot end it early.
    EXECUTE format(
        'CREATE OR REPLACE FUNCTION pgembed.search('
        'model text, query %s, k integer DEFAULT 10, filter jsonb DEFAULT NULL) '
        'RETURNS TABLE (key text, similarity double precision) LANGUAGE plpgsql '
        'SET plan_cache_mode = force_generic_plan AS %L',
        vector_type, format($body$
-- A table's own columns may be named like these variables: they are always written t.<column>.
#variable_conflict use_variable
DECLARE
    ef text;
    scan text;
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

-- Only pgembed's own migration and trigger rebuild the function.
REVOKE EXECUTE ON FUNCTION pgembed._compile_search_v1() FROM PUBLIC;

-- SECURITY DEFINER: whoever may change pgembed.models (e.g. `pgembed tune` as another role)
-- rebuilds the function as its owner.
CREATE FUNCTION pgembed._recompile_search_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM pgembed._compile_search_v1();
    RETURN NULL;
END
$fn$;

-- Every change to what the generated queries read: a model added, removed, renamed, switched to
-- a new version (dimensions, column), or given an ef_search by `pgembed tune`. Deferred to the
-- commit, so the rebuild's lock is held for milliseconds, never behind a table lock, and sees
-- the transaction's last state.
CREATE CONSTRAINT TRIGGER recompile_search
AFTER INSERT OR DELETE OR UPDATE OF name, table_schema, table_name, key_column, embedding_column,
    dimensions, ef_search
ON pgembed.models DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION pgembed._recompile_search_v1();
CREATE TRIGGER recompile_search_truncate
AFTER TRUNCATE ON pgembed.models FOR EACH STATEMENT EXECUTE FUNCTION pgembed._recompile_search_v1();

SELECT pgembed._compile_search_v1();
