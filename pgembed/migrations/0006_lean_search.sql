-- pgembed 0006: pgembed.search within 1.2x of the raw statement.
-- 0005's generated branches set and put back hnsw.ef_search and hnsw.iterative_scan with four
-- PERFORMs, and PERFORM runs a whole query through the executor (pgbench, 2,000 rows: 1.26x the
-- raw statement with them, 1.20x without).
-- Now each setting is changed with an assignment, which PL/pgSQL evaluates as a lone expression,
-- and ef_search only when the value in force is not already the one to use (the common case:
-- nobody set it and the model has no tuned value). The generated function is otherwise 0005's.

CREATE OR REPLACE FUNCTION pgembed._compile_search_v1() RETURNS void
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

SELECT pgembed._compile_search_v1();
