-- pgembed.search with 'sample' given two walks: pg_get_functiondef of pgembed.search(text, vector, integer, jsonb).
-- Written by tests/integration/test_schema.py with PGEMBED_UPDATE_SNAPSHOTS=1; do not edit.
CREATE OR REPLACE FUNCTION pgembed.search(model text, query vector, k integer DEFAULT 10, filter jsonb DEFAULT NULL::jsonb)
 RETURNS TABLE(key text, similarity double precision)
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET search_path TO 'pg_catalog', 'pg_temp'
 SET "DateStyle" TO 'ISO, MDY'
 SET "IntervalStyle" TO 'postgres'
 SET "TimeZone" TO 'utc'
 SET extra_float_digits TO '1'
 SET bytea_output TO 'hex'
AS $function$
-- A table's own columns may be named like these variables: they are always written t.<column>.
#variable_conflict use_variable
DECLARE
    effort integer;
    ef text;
    keys text[];
    similarities double precision[];
    first_keys text[];
    first_similarities double precision[];
    scan text;
    seq text;
    done text;
    walking text;
    exact boolean;
BEGIN
    IF (filter IS NOT NULL AND jsonb_typeof(filter) <> 'null') OR k IS NULL OR k < 1
       OR query IS NULL THEN
        RETURN QUERY SELECT * FROM pgembed._nearest_v1(
            model, query, k, filter, NULL, pgembed._settings_v1(model));
        RETURN;
    END IF;
    CASE model
    WHEN 'sample' THEN
        -- The dynamic path, or its error; and under row-level security that applies to the
        -- caller, whose policy shows it some of the rows: the walk is sized by those (_path_v1).
        IF public.vector_dims(query) <> 3 OR k > 100 OR public.vector_norm(query) = 0 OR row_security_active('public.docs') THEN
            RETURN QUERY SELECT * FROM pgembed._nearest_v1(
                model, query, k, NULL, NULL, pgembed._settings_v1(model));
            RETURN;
        END IF;
        -- A tiny table is read whole (below): faster there than its index, and exact (effort
        -- 0). Else the index, with the model's ef_search or one grown with the table
        -- (_index_effort_v1).
        effort := pgembed._index_effort_v1('public.docs', k, CASE WHEN k = 10 THEN 40 ELSE 100 END);
        IF effort > 0 THEN
            -- ef_search: pgembed.ef_search, else the caller's own value, else that effort.
            -- Changed (and put back) only when it differs from the value in force.
            -- Assignments, not PERFORM: PL/pgSQL evaluates a lone expression without the
            -- executor.
            IF nullif(current_setting('pgembed.ef_search', true), '') IS NOT NULL THEN
                ef := current_setting('hnsw.ef_search');
                done := set_config('hnsw.ef_search', pgembed._ef_search_v1(), true);
            ELSIF current_setting('hnsw.ef_search') <> effort::text
                  AND NOT pgembed._own_setting_v1('hnsw.ef_search', '40') THEN
                ef := current_setting('hnsw.ef_search');
                done := set_config('hnsw.ef_search', effort::text, true);
            END IF;
            -- First one walk of ef_search (no iterative scan), which returns its rows nearest
            -- first; a strict-order iterative scan only when it found fewer than k rows (dead
            -- tuples hid some of them): its first walk is the same, and it goes on until k
            -- rows. Iterating from the start cost 5-11 % more (docs/decisions.md). An
            -- ef_search below k cannot give k rows in one walk: then the strict scan alone.
            scan := current_setting('hnsw.iterative_scan');
            -- The index, not an exact scan: the planner's cost of one leaves out reading each
            -- vector back from TOAST (see _exact_v1). Set before every run: a plan is made (or
            -- remade after an ANALYZE) when the statement runs.
            seq := current_setting('enable_seqscan');
            done := set_config('enable_seqscan', 'off', true);
            -- The inner LIMIT is a constant, so the one generic plan is costed for that many
            -- rows, as the raw statement is (a LIMIT parameter would be costed as 10 % of the
            -- table, and sorting the table would win); the outer LIMIT stops the scan after k
            -- rows.
            FOREACH walking IN ARRAY ARRAY['off', 'strict_order'] LOOP
                CONTINUE WHEN walking = 'off' AND current_setting('hnsw.ef_search')::integer < k;
                EXIT WHEN coalesce(cardinality(keys), 0) >= k;
                done := set_config('hnsw.iterative_scan', walking, true);
                IF k <= 10 THEN
            SELECT array_agg(hits.key ORDER BY hits.distance),
                   array_agg(1 - hits.distance ORDER BY hits.distance)
            INTO keys, similarities FROM (
                SELECT found.* FROM (
                    SELECT t.id::text AS key, t.embedding_sample OPERATOR(public.<=>) query AS distance
                    FROM ONLY public.docs t
                    WHERE t.embedding_sample IS NOT NULL
                    ORDER BY t.embedding_sample OPERATOR(public.<=>) query
                    LIMIT 10) found
                LIMIT k) hits;
                ELSE
            SELECT array_agg(hits.key ORDER BY hits.distance),
                   array_agg(1 - hits.distance ORDER BY hits.distance)
            INTO keys, similarities FROM (
                SELECT found.* FROM (
                    SELECT t.id::text AS key, t.embedding_sample OPERATOR(public.<=>) query AS distance
                    FROM ONLY public.docs t
                    WHERE t.embedding_sample IS NOT NULL
                    ORDER BY t.embedding_sample OPERATOR(public.<=>) query
                    LIMIT 100) found
                LIMIT k) hits;
                END IF;
            END LOOP;
            IF k = 10 AND cardinality(keys) = 10
               AND current_setting('hnsw.iterative_scan') = 'off'
               AND 1 - (SELECT avg(hit.near) FROM unnest(similarities) AS hit(near)) >= 0.42
               AND nullif(current_setting('pgembed.ef_search', true), '') IS NULL
               AND (ef IS NOT NULL OR NOT pgembed._own_setting_v1('hnsw.ef_search', '40')) THEN
                first_keys := keys;
                first_similarities := similarities;
                ef := coalesce(ef, current_setting('hnsw.ef_search'));
                done := set_config('hnsw.ef_search', '1000', true);
                done := set_config('hnsw.iterative_scan', 'off', true);
                SELECT array_agg(hits.key ORDER BY hits.distance),
                       array_agg(1 - hits.distance ORDER BY hits.distance)
                INTO keys, similarities FROM (
                    SELECT found.* FROM (
                        SELECT t.id::text AS key, t.embedding_sample OPERATOR(public.<=>) query AS distance
                        FROM ONLY public.docs t
                        WHERE t.embedding_sample IS NOT NULL
                        ORDER BY t.embedding_sample OPERATOR(public.<=>) query
                        LIMIT 10) found
                    LIMIT k) hits;
                IF coalesce(cardinality(keys), 0) < k THEN
                    keys := first_keys;
                    similarities := first_similarities;
                END IF;
            END IF;
            -- A SET clause restores only the settings it names: put back the caller's (an
            -- error needs nothing, the rollback does it).
            done := set_config('hnsw.iterative_scan', scan, true);
            done := set_config('enable_seqscan', seq, true);
            IF ef IS NOT NULL THEN
                done := set_config('hnsw.ef_search', ef, true);
            END IF;
        END IF;
        -- A tiny table, or fewer than k rows from the index where it may have missed some (the
        -- strict scan stops at hnsw.max_scan_tuples, and row-level security may hide most of
        -- the rows it meets: _came_short_v1): the rows read exactly, so that the search gives k
        -- rows whenever k rows have a vector.
        exact := effort = 0;
        IF NOT exact AND coalesce(cardinality(keys), 0) < k THEN
            exact := pgembed._came_short_v1(pgembed._model_v1(model),
                                            coalesce(cardinality(keys), 0), k);
        END IF;
        IF exact THEN
            SELECT array_agg(hits.key ORDER BY hits.distance),
                   array_agg(1 - hits.distance ORDER BY hits.distance)
            INTO keys, similarities FROM (
                SELECT found.* FROM (
                    SELECT t.id::text AS key, t.embedding_sample OPERATOR(public.<=>) query AS distance
                    FROM ONLY public.docs t
                    WHERE t.embedding_sample IS NOT NULL
                    OFFSET 0) found
                ORDER BY found.distance LIMIT k) hits;
        END IF;
        RETURN QUERY SELECT u.key, u.similarity
            FROM unnest(keys, similarities) WITH ORDINALITY AS u(key, similarity, n)
            ORDER BY u.n;
    ELSE  -- not a model: the dynamic path says so
        RETURN QUERY SELECT * FROM pgembed._nearest_v1(
            model, query, k, NULL, NULL, pgembed._settings_v1(model));
    END CASE;
END
$function$
