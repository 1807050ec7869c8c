-- pgembed 0011: long texts in chunks (issue 12). A model made with `--long-texts chunk` keeps
-- the windows of a long text past the first in a table beside its own, pgembed_<name>_chunks
-- (key, chunk, embedding) with an HNSW index (pgembed/catalog/ddl.py makes it, owned by the owner
-- of schema pgembed); the first window stays in the model's column. Searches rank a row by its
-- best window. The capture functions take the chunk table as one more argument, and clean it up
-- on update, delete and truncate; a model without one is unchanged.

ALTER TABLE pgembed.models ADD COLUMN long_texts text NOT NULL DEFAULT 'truncate'
    CONSTRAINT models_long_texts_check CHECK (long_texts IN ('truncate', 'chunk'));

-- pgembed's own table by this name (a quoted, qualified name), else NULL: a plain table owned by
-- the owner of schema pgembed (`model add` gives it that owner). Anything else by that name, a
-- view or another role's table put there after pgembed's was dropped, could run that role's code
-- (a trigger, a rule, a function in a view) as whoever writes or reads the chunks.
CREATE FUNCTION pgembed._own_chunks_v1(chunks text) RETURNS regclass
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT c.oid::regclass FROM pg_class c
    WHERE c.oid = to_regclass(chunks) AND c.relkind = 'r'
      AND c.relowner = (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = 'pgembed')
$fn$;

-- A chunked model's chunk table, named by the trigger's argument (NULL: the model does not chunk).
-- One that is gone (dropped by hand) or not pgembed's only warns: the application's write goes on.
CREATE FUNCTION pgembed._chunk_table_v1(model text, chunks text) RETURNS regclass
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
    texts text[] := string_to_array(TG_ARGV[2], ',');
    missing text := pgembed._missing_column_v1(
        TG_RELID, TG_ARGV[0], TG_ARGV[1:1] || texts || TG_ARGV[3:3]);
    -- Only a chunked model's triggers pay for the lookup: this runs for every row updated.
    chunks regclass := CASE WHEN TG_NARGS > 4
                            THEN pgembed._chunk_table_v1(TG_ARGV[0], TG_ARGV[4]) END;
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
    IF text_changed OR old_key IS NOT DISTINCT FROM new_key OR vector_missing
       OR chunks IS NOT NULL THEN
        NEW := jsonb_populate_record(NEW, jsonb_build_object(TG_ARGV[3], NULL));
        IF chunks IS NOT NULL THEN
            EXECUTE format('DELETE FROM %s c WHERE c.key = ($1).%I', chunks, TG_ARGV[1])
                USING OLD;
        END IF;
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
        EXECUTE format('DELETE FROM %s c USING pgembed_old o WHERE c.key = o.%I',
                       chunks, TG_ARGV[1]);
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

-- A chunked model's chunk table, pgembed_<name>_chunks beside its table, if it is pgembed's
-- (see _own_chunks_v1); else NULL.
CREATE FUNCTION pgembed._model_chunks_v1(m pgembed.models) RETURNS regclass
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT pgembed._own_chunks_v1(
        format('%I.%I', m.table_schema, 'pgembed_' || m.name || '_chunks'))
$fn$;

-- The SQL of a model's nearest rows: `key` (as text), `distance` to the query $1 and `settled`,
-- nearest first, at most `lim` rows (an SQL expression) that meet `conditions` (" AND ..." on
-- t.<column>). A chunked model ranks a row by its best window: its own vector (the first window)
-- or a chunk of pgembed_<name>_chunks. Each of the two is an `ORDER BY ... <=> $1 LIMIT` of its
-- own, so each can take its HNSW index; the chunks' reads `depth` times deeper, since a row's
-- chunks can crowd each other. `settled` says no unread chunk could change the rows: the scan
-- ran out of chunks, or its farthest is no nearer than the last row (else the caller reads
-- deeper). A chunk counts only while its row has a vector: a row whose text changed waits for
-- its new chunks with its new vector.
CREATE FUNCTION pgembed._semantic_v1(
    m pgembed.models, conditions text, lim text, depth integer
) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    chunks regclass;
BEGIN
    IF m.long_texts <> 'chunk' THEN
        RETURN format(
            'SELECT t.%1$I::text AS key, t.%2$I %6$s $1 AS distance, true AS settled
             FROM %3$I.%4$I t
             WHERE t.%2$I IS NOT NULL%5$s
             ORDER BY t.%2$I %6$s $1
             LIMIT %7$s',
            m.key_column, m.embedding_column, m.table_schema, m.table_name, conditions,
            pgembed._distance_v1(), lim);
    END IF;
    chunks := pgembed._model_chunks_v1(m);
    IF chunks IS NULL THEN
        RAISE EXCEPTION 'model %: its chunk table %.% is gone or not pgembed''s: run `pgembed '
            'reindex %`', m.name, quote_ident(m.table_schema),
            quote_ident('pgembed_' || m.name || '_chunks'), m.name
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    RETURN format(
        'WITH own AS MATERIALIZED (
             SELECT t.%1$I::text AS key, t.%2$I %6$s $1 AS distance
             FROM %3$I.%4$I t
             WHERE t.%2$I IS NOT NULL%5$s
             ORDER BY t.%2$I %6$s $1
             LIMIT %7$s),
         pieces AS MATERIALIZED (
             SELECT t.%1$I::text AS key, c.embedding %6$s $1 AS distance
             FROM %8$s c JOIN %3$I.%4$I t ON t.%1$I = c.key
             WHERE t.%2$I IS NOT NULL%5$s
             ORDER BY c.embedding %6$s $1
             LIMIT %9$s * (%7$s)::bigint),
         best AS MATERIALIZED (
             SELECT u.key, min(u.distance) AS distance
             FROM (SELECT * FROM own UNION ALL SELECT * FROM pieces) u
             GROUP BY u.key
             ORDER BY distance
             LIMIT %7$s)
         SELECT b.key, b.distance,
                (SELECT count(*) FROM pieces) < %9$s * (%7$s)::bigint
                OR ((SELECT count(*) FROM best) >= %7$s
                    AND (SELECT max(p.distance) FROM pieces p)
                        >= (SELECT max(x.distance) FROM best x)) AS settled
         FROM best b',
        m.key_column, m.embedding_column, m.table_schema, m.table_name, conditions,
        pgembed._distance_v1(), lim, chunks, depth);
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
    knob text;
    caller text;
    depth integer;
    keys text[];
    distances double precision[];
    settled boolean;
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
                          AND (m.long_texts <> 'chunk'
                               OR pgembed._exact_v1(pgembed._model_chunks_v1(m)))
                     THEN 'enable_indexscan' ELSE 'enable_seqscan' END;
        caller := current_setting(knob);
        PERFORM set_config(knob, 'off', true);
    END IF;
    -- A chunked model's rows are certain once no unread chunk could change them: read deeper
    -- until they are (usually at once; 4^6 times k chunks at most).
    depth := 4;
    LOOP
        EXECUTE format(
            'SELECT array_agg(s.key ORDER BY s.distance), array_agg(s.distance ORDER BY s.distance),
                    bool_and(s.settled)
             FROM (%s) s',
            pgembed._semantic_v1(m, not_self || f.clause, '$2', depth))
            INTO keys, distances, settled USING query, k, exclude_key, f.args;
        EXIT WHEN settled IS NOT FALSE OR depth >= 4096;
        depth := depth * 4;
    END LOOP;
    RETURN QUERY SELECT u.key, 1 - u.distance
        FROM unnest(keys, distances) WITH ORDINALITY AS u(key, distance, n) ORDER BY u.n;
    IF knob IS NOT NULL THEN  -- no SET clause names it: put back the caller's value
        PERFORM set_config(knob, caller, true);
    END IF;
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
        'WITH semantic AS MATERIALIZED (%7$s),
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
        pgembed._semantic_v1(m, f.clause, '$3', 4))
        USING query, query_text, greatest(4 * k::bigint, 40), k, f.args;
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
        IF m.long_texts = 'chunk' THEN  -- two indexes to merge: the dynamic path's statement
            branches := branches || format($chunked$
    WHEN %1$L THEN
        RETURN QUERY SELECT * FROM pgembed._nearest_v1(
            model, query, k, NULL, NULL, pgembed._settings_v1(model));$chunked$, m.name);
            CONTINUE;
        END IF;
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

DROP TRIGGER recompile_search ON pgembed.models;
-- Every change to what the generated queries read (a model added, removed, renamed, switched to
-- a new version, or tuned), deferred to the commit: the rebuild sees the transaction's last state.
CREATE CONSTRAINT TRIGGER recompile_search
AFTER INSERT OR DELETE OR UPDATE OF name, table_schema, table_name, key_column, embedding_column,
    dimensions, ef_search, long_texts
ON pgembed.models DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION pgembed._recompile_search_v1();

SELECT pgembed._compile_search_v1();
