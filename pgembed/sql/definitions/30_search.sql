-- pgembed's SQL definitions (2 of 3): the search helpers pgembed.search, pgembed.similar and
-- pgembed.hybrid_search, the functions behind them, and the compiler that generates
-- pgembed.search from the catalog (with the triggers that rerun it).
-- The one definition of each: `pgembed migrate` re-applies this file (CREATE OR REPLACE) after
-- the run-once migrations whenever it changed, so a fix is an edit here, never a copy in a
-- migration. See 20_capture.sql for the rules.
--
-- Identifiers reach the generated SQL only through format('%I') (or format_type(), from the
-- server); filter values are never SQL text: they travel as one bound jsonb parameter.
-- Everything but the compiler's trigger is SECURITY INVOKER: a caller finds only rows it could
-- SELECT anyway. Every function pins search_path to pg_catalog (pgvector's names are written
-- with the extension's schema), and the functions that write keys as text pin the settings that
-- shape that text (datestyle, timezone, ...), so keys look the same whoever asks.
-- A model's table is read ONLY: an inheritance child's rows are not the model's (`model add`
-- refuses a table with children; one made later makes the model broken), and its triggers never
-- see their writes, so a child's vector, forged or stale, is never served.

-- Load pgvector so the hnsw.* settings named below are its real ones, not placeholders.
SELECT vector_dims('[0]'::vector);

------------------------------------------------------------------------------------------------
-- The dynamic path: every search with a filter, every error, and pgembed.similar/hybrid_search.
------------------------------------------------------------------------------------------------

-- pgvector's cosine distance operator, named by the extension's schema: every pgembed function
-- resolves names in pg_catalog only, so nobody's schema on a search_path can take a name over.
CREATE OR REPLACE FUNCTION pgembed._distance_v1() RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT format('OPERATOR(%I.<=>)', n.nspname)
    FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
    WHERE e.extname = 'vector'
$fn$;

-- How alike two strings are, as Python's difflib.SequenceMatcher(None, a, b).ratio() says (the
-- rule of the Python side's "did you mean", registry.unknown): twice the characters of the
-- matching blocks over both lengths. The blocks are difflib's: the longest common substring (the
-- earliest in a, then in b), then the same on each side of it. (difflib's "popular character"
-- heuristic starts at 200 characters: model names are at most 48.) No fuzzystrmatch needed.
CREATE OR REPLACE FUNCTION pgembed._likeness_v1(a text, b text) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    todo integer[] := ARRAY[1, length(a) + 1, 1, length(b) + 1];  -- [alo, ahi), [blo, bhi) ...
    alo integer; ahi integer; blo integer; bhi integer;
    best_i integer; best_j integer; best_k integer;
    prev integer[];
    cur integer[];
    k integer;
    matched integer := 0;
BEGIN
    IF length(a) + length(b) = 0 THEN
        RETURN 1;
    END IF;
    WHILE cardinality(todo) > 0 LOOP
        alo := todo[1]; ahi := todo[2]; blo := todo[3]; bhi := todo[4];
        todo := todo[5:];
        -- The longest a[i, i+k) = b[j, j+k) in the ranges: k(i, j) = k(i-1, j-1) + 1 on a match.
        best_i := alo; best_j := blo; best_k := 0;
        prev := '{}';
        FOR i IN alo .. ahi - 1 LOOP
            cur := '{}';
            FOR j IN blo .. bhi - 1 LOOP
                IF substr(a, i, 1) COLLATE "C" = substr(b, j, 1) COLLATE "C" THEN
                    k := coalesce(prev[j - 1], 0) + 1;
                    cur[j] := k;
                    IF k > best_k THEN
                        best_i := i - k + 1; best_j := j - k + 1; best_k := k;
                    END IF;
                END IF;
            END LOOP;
            prev := cur;
        END LOOP;
        CONTINUE WHEN best_k = 0;
        matched := matched + best_k;
        IF alo < best_i AND blo < best_j THEN
            todo := todo || ARRAY[alo, best_i, blo, best_j];
        END IF;
        IF best_i + best_k < ahi AND best_j + best_k < bhi THEN
            todo := todo || ARRAY[best_i + best_k, ahi, best_j + best_k, bhi];
        END IF;
    END LOOP;
    RETURN 2.0 * matched / (length(a) + length(b));
END
$fn$;

-- The names a mistyped `name` may mean, by the Python side's rule (difflib.get_close_matches of
-- the name in lower case, n=3, cutoff=0.6): at most 3 of `names` at least 0.6 alike, most alike
-- first (ties: the greater name first, as Python's nlargest orders them). A name longer than any
-- model's gets none (and costs nothing: the comparison grows with the product of the lengths).
CREATE OR REPLACE FUNCTION pgembed._close_names_v1(word text, names text[]) RETURNS text[]
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT coalesce((array_agg(c.candidate ORDER BY c.likeness DESC,
                                                    c.candidate COLLATE "C" DESC))[1:3], '{}')
    FROM (SELECT n.candidate, pgembed._likeness_v1(n.candidate, lower(word)) AS likeness
          FROM unnest(names) AS n(candidate)
          WHERE length(word) <= 100) c
    WHERE c.likeness >= 0.6
$fn$;

-- The catalog row of a model, or a clear error (with "did you mean" the close names of the
-- user's models, a reindex's shadows left out, as the Python side words it).
CREATE OR REPLACE FUNCTION pgembed._model_v1(model text) RETURNS pgembed.models
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    m pgembed.models;
    close text[];
BEGIN
    SELECT * INTO m FROM pgembed.models WHERE name = model;
    IF NOT FOUND THEN
        close := pgembed._close_names_v1(
            model, ARRAY(SELECT x.name FROM pgembed.models x WHERE x.shadow_of IS NULL));
        IF cardinality(close) = 0 THEN
            RAISE EXCEPTION 'unknown model %: see `pgembed model list`', to_json(model)::text
                USING ERRCODE = 'undefined_object';
        END IF;
        RAISE EXCEPTION 'unknown model %: did you mean %? (see `pgembed model list`)',
            to_json(model)::text,
            (SELECT string_agg(to_json(c)::text, ' or ' ORDER BY n) FROM unnest(close)
                    WITH ORDINALITY AS u(c, n))
            USING ERRCODE = 'undefined_object';
    END IF;
    RETURN m;
END
$fn$;

-- The type of a column of the model's table without its modifier (a cast to it never truncates).
-- Without a length, `character` and `bit` mean one character or bit: a `character(n)` value is
-- read as `bpchar`, of any length; a `bit(n)` one with its length, whose input refuses another
-- length (`bit varying` would compare the column as a cast, past its B-tree index).
CREATE OR REPLACE FUNCTION pgembed._column_type_v1(m pgembed.models, col text) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE a.atttypid
               WHEN 'pg_catalog.bpchar'::regtype THEN 'bpchar'
               WHEN 'pg_catalog._bpchar'::regtype THEN 'bpchar[]'
               ELSE format_type(a.atttypid, CASE WHEN a.atttypid IN ('pg_catalog.bit'::regtype,
                                                                    'pg_catalog._bit'::regtype)
                                                 THEN a.atttypmod END) END
    FROM pg_attribute a
    WHERE a.attrelid = to_regclass(format('%I.%I', m.table_schema, m.table_name))
      AND a.attname = col AND a.attnum > 0 AND NOT a.attisdropped
$fn$;

-- A JSON array's elements as text. IMMUTABLE, so in a search's one-shot plan (EXECUTE ... USING,
-- whose parameters are constants to the planner) it is evaluated once, while planning: `$in`'s
-- `t.col = ANY (<constant array>)` is then a hash lookup per row (and the estimate sees the
-- values), where `ANY (ARRAY(SELECT ...))` compared each row with every value: 3,000 rows and
-- 100,000 values took 20 s.
CREATE OR REPLACE FUNCTION pgembed._texts_v1(val jsonb) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT ARRAY(SELECT jsonb_array_elements_text(val))
$fn$;

-- The same for a jsonb column: the elements as JSON values (a JSON null, which matches the NULL
-- rows instead, left out).
CREATE OR REPLACE FUNCTION pgembed._jsons_v1(val jsonb) RETURNS jsonb[]
LANGUAGE sql IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT ARRAY(SELECT e FROM jsonb_array_elements(val) e WHERE jsonb_typeof(e) <> 'null')
$fn$;

-- The base type of a column's type, through its domains.
CREATE OR REPLACE FUNCTION pgembed._base_type_v1(typ text) RETURNS regtype
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    WITH RECURSIVE d(id) AS (
        SELECT typ::regtype::oid
        UNION ALL
        SELECT t.typbasetype FROM pg_type t JOIN d ON t.oid = d.id WHERE t.typtype = 'd'
    )
    SELECT t.oid::regtype FROM d JOIN pg_type t ON t.oid = d.id WHERE t.typtype <> 'd'
$fn$;

-- Whether a filter compares a column of this base type by its operator class's operators,
-- schema-qualified (_operator_v1): a base type outside pg_catalog. The helpers run with
-- search_path pg_catalog, where a bare `=` between two values of an extension's type (citext)
-- found no operator of that type and fell back through an implicit cast to text's: citext
-- values compared case-sensitively. pg_catalog's types, and enums, ranges, arrays and records
-- (whose operators are pg_catalog's; an array's compare its elements by their type's B-tree
-- class), keep the bare operator.
CREATE OR REPLACE FUNCTION pgembed._foreign_type_v1(base regtype) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT t.typnamespace <> 'pg_catalog'::regnamespace AND t.typtype = 'b'
           AND t.typcategory <> 'A'
    FROM pg_type t WHERE t.oid = base
$fn$;

-- The operator a filter writes for `op` (=, <, <=, >=, >) on a column of base type `base`: the
-- bare one, or for a type outside pg_catalog (_foreign_type_v1) its default B-tree operator
-- class's, schema-qualified. A superuser made that class, as CREATE OPERATOR CLASS needs one,
-- and it is the comparison its B-tree index uses. OPERATOR(s.=) is still looked up by its
-- operands' types, so both sides are of the base type itself (_condition_v1): for a domain's,
-- anyone who may CREATE in that schema could add an `=` of the domain.
CREATE OR REPLACE FUNCTION pgembed._operator_v1(col text, base regtype, op text) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    qualified text;
BEGIN
    IF NOT pgembed._foreign_type_v1(base) THEN
        RETURN op;
    END IF;
    SELECT format('OPERATOR(%I.%s)', n.nspname, o.oprname) INTO qualified
    FROM pg_opclass c
    JOIN pg_am a ON a.oid = c.opcmethod AND a.amname = 'btree'
    JOIN pg_amop p ON p.amopfamily = c.opcfamily AND p.amoplefttype = c.opcintype
                  AND p.amoprighttype = c.opcintype
                  AND p.amopstrategy = CASE op WHEN '<' THEN 1 WHEN '<=' THEN 2 WHEN '=' THEN 3
                                               WHEN '>=' THEN 4 WHEN '>' THEN 5 END
    JOIN pg_operator o ON o.oid = p.amopopr
    JOIN pg_namespace n ON n.oid = o.oprnamespace
    WHERE c.opcdefault AND c.opcintype = base;
    IF qualified IS NULL THEN
        RAISE EXCEPTION 'filter on %: its type % has no default B-tree operator class, so its '
            'values cannot be compared by a filter', to_json(col)::text, base
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN qualified;
END
$fn$;

-- A model's key column's base type (through its domains, by OID: a type's name would need
-- USAGE on its schema); NULL when the column is gone. Found by name, not to_regclass(): a role
-- without USAGE on the table's schema (the daemon reading every model, trust.py) gets NULL.
CREATE OR REPLACE FUNCTION pgembed._key_base_v1(
    table_schema text, table_name text, key_column text
) RETURNS regtype
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    WITH RECURSIVE d(id) AS (
        SELECT a.atttypid FROM pg_class c
        JOIN pg_namespace s ON s.oid = c.relnamespace
        JOIN pg_attribute a ON a.attrelid = c.oid
        WHERE s.nspname = table_schema AND c.relname = table_name
          AND a.attname = key_column AND a.attnum > 0 AND NOT a.attisdropped
        UNION ALL
        SELECT t.typbasetype FROM pg_type t JOIN d ON t.oid = d.id WHERE t.typtype = 'd'
    )
    SELECT t.oid::regtype FROM d JOIN pg_type t ON t.oid = d.id AND t.typtype <> 'd'
$fn$;

-- The schema of that type, unless pg_catalog: the daemon casts keys to the type and compares
-- them by its operators (_key_v1), which needs USAGE on it (roles.py grants it where it may,
-- trust.py says when it is missing).
CREATE OR REPLACE FUNCTION pgembed._key_schema_v1(
    table_schema text, table_name text, key_column text
) RETURNS name
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT n.nspname FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
    WHERE t.oid = pgembed._key_base_v1(table_schema, table_name, key_column)
      AND n.nspname <> 'pg_catalog'
$fn$;

-- How a statement compares a model's key column (table_schema.table_name.key_column) so that
-- the key's index answers it: the type a key's text is cast to and the `=` and `>` that compare
-- two such values, all schema-qualified. The type is the column's base type (a domain's checks
-- are not run on keys read from its own rows; `bit` and `bpchar` without a length take any),
-- and both sides are cast to it (_key_equal_v1), so a domain's own `=`, which anyone who may
-- CREATE in that schema could add, is never the one found. A key of an extension's type
-- (citext) is compared by its default B-tree operator class's operators (_operator_v1):
-- pg_catalog's `=` would reach it through the cast to text and scan the table. The type is
-- followed by OID, never by name (a name needs USAGE on its schema: one model's key type would
-- fail every read of the catalog by a role without it), and the function never fails: NULLs
-- when the column is gone, pg_catalog's operators for a type without a default B-tree class.
-- pgembed's Python reads this with each model (catalog/registry.py), the search functions and
-- capture triggers where they compare keys.
CREATE OR REPLACE FUNCTION pgembed._key_v1(
    table_schema text, table_name text, key_column text,
    OUT cast_to text, OUT equals text, OUT greater text
)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    base regtype := pgembed._key_base_v1(table_schema, table_name, key_column);
BEGIN
    IF base IS NULL THEN
        RETURN;
    END IF;
    SELECT format('%I.%I', n.nspname, t.typname) INTO cast_to
    FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE t.oid = base;
    equals := 'OPERATOR(pg_catalog.=)';
    greater := 'OPERATOR(pg_catalog.>)';
    IF pgembed._foreign_type_v1(base) THEN
        BEGIN
            equals := pgembed._operator_v1(key_column, base, '=');
            greater := pgembed._operator_v1(key_column, base, '>');
        EXCEPTION WHEN invalid_parameter_value THEN  -- no default B-tree class: as before
            equals := 'OPERATOR(pg_catalog.=)';
            greater := 'OPERATOR(pg_catalog.>)';
        END;
    END IF;
END
$fn$;

-- `lhs = rhs` for a model's key as _key_v1 compares it: lhs the key column (an SQL expression),
-- rhs a key's text or value, both cast to the key's base type. A column that is gone keeps
-- pg_catalog's `=` and text, so the statement then fails by naming it.
CREATE OR REPLACE FUNCTION pgembed._key_equal_v1(
    table_schema text, table_name text, key_column text, lhs text, rhs text
) RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE WHEN k.cast_to IS NULL
                THEN format('%s OPERATOR(pg_catalog.=) (%s)::pg_catalog.text', lhs, rhs)
                ELSE format('(%s)::%s %s (%s)::%s', lhs, k.cast_to, k.equals, rhs, k.cast_to) END
    FROM pgembed._key_v1(table_schema, table_name, key_column) k
$fn$;

-- One filter condition on t.<col>; its value is `$<param> -> <slot>`, a bound parameter.
CREATE OR REPLACE FUNCTION pgembed._condition_v1(
    col text, typ text, op text, val jsonb, param integer, slot integer
) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    -- A `timestamp` column's values are read as `timestamptz` (compared across the two types,
    -- by its B-tree index too): a time zone offset in the text moves the instant, as a Python
    -- datetime's does (sent as UTC), where a cast to `timestamp` ignored it. The helpers run in
    -- UTC, so a value without an offset is the same wall-clock time as before.
    base regtype := pgembed._base_type_v1(typ);
    -- A column of a domain over an extension's type is compared as that type (_operator_v1).
    outside boolean := pgembed._foreign_type_v1(base);
    cast_to text := CASE WHEN outside THEN base::text
                         WHEN typ = 'timestamp without time zone' THEN 'timestamp with time zone'
                         ELSE typ END;
    -- A jsonb column's value is the JSON value itself: its text read again as JSON made the
    -- string "{\"r\": 1}" the object {"r": 1}, and refused the string "abc". A json column,
    -- which has no `=`, compares as jsonb (a domain over either alike).
    json boolean := base IN ('jsonb'::regtype, 'json'::regtype);
    target text := CASE WHEN base = 'json'::regtype THEN format('t.%I::pg_catalog.jsonb', col)
                        WHEN outside AND base <> typ::regtype THEN format('t.%I::%s', col, base)
                        ELSE format('t.%I', col) END;
    value text := CASE WHEN json THEN format('($%s -> %s)', param, slot)
                       ELSE format('($%s ->> %s)::%s', param, slot, cast_to) END;
    eq text;
BEGIN
    IF op = '$in' THEN
        IF jsonb_typeof(val) <> 'array' THEN
            RAISE EXCEPTION 'filter on %: $in needs a JSON array, not %', to_json(col)::text,
                jsonb_typeof(val) USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF typ LIKE '%[]' THEN
            RAISE EXCEPTION 'filter on %: $in on an array column (%) is not supported; $eq '
                'compares the whole array', to_json(col)::text, typ
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        value := format('%s %s ANY (%s)', target, pgembed._operator_v1(col, base, '='),
                        CASE WHEN json THEN format('pgembed._jsons_v1($%s -> %s)', param, slot)
                             ELSE format('pgembed._texts_v1($%s -> %s)::%s[]', param, slot,
                                         cast_to) END);
        -- A null among the values matches the rows whose column is NULL, as {"col": null} does.
        RETURN CASE WHEN val @> '[null]' THEN format('(%s OR %s IS NULL)', value, target)
                    ELSE value END;
    ELSIF op IN ('$eq', '$ne', '$gt', '$gte', '$lt', '$lte')
          AND jsonb_typeof(val) IN ('array', 'object') AND NOT json THEN
        RAISE EXCEPTION 'filter on %: % needs one value, not a JSON % (%)',
            to_json(col)::text, op, jsonb_typeof(val),
            CASE WHEN typ LIKE '%[]' THEN 'an array column''s value is written as text: "{a,b}"'
                 ELSE 'a list of values: $in' END
            USING ERRCODE = 'invalid_parameter_value';
    ELSIF op = '$eq' THEN
        RETURN CASE WHEN jsonb_typeof(val) = 'null' THEN format('%s IS NULL', target)
                    ELSE format('%s %s %s', target, pgembed._operator_v1(col, base, '='), value)
               END;
    ELSIF op = '$ne' THEN  -- like MongoDB's $ne, rows whose column is NULL match
        IF jsonb_typeof(val) = 'null' THEN  -- a JSON null, not the JSON value null of a jsonb
            RETURN format('%s IS NOT NULL', target);
        END IF;
        eq := pgembed._operator_v1(col, base, '=');
        IF eq = '=' THEN
            RETURN format('%s IS DISTINCT FROM %s', target, value);
        END IF;
        -- IS DISTINCT FROM would look `=` up by name, as pg_catalog's.
        RETURN format('(%1$s IS NULL OR NOT (%1$s %2$s %3$s))', target, eq, value);
    ELSIF op IN ('$gt', '$gte', '$lt', '$lte') THEN
        IF jsonb_typeof(val) = 'null' THEN
            RAISE EXCEPTION 'filter on %: % needs a value, not null', to_json(col)::text, op
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RETURN format('%s %s %s', target,
                      pgembed._operator_v1(col, base, CASE op WHEN '$gt' THEN '>'
                                                             WHEN '$gte' THEN '>='
                                                             WHEN '$lt' THEN '<' ELSE '<=' END),
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
    json boolean;
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
        json := pgembed._base_type_v1(typ) IN ('jsonb'::regtype, 'json'::regtype);
        IF jsonb_typeof(spec) <> 'object' THEN
            spec := jsonb_build_object('$eq', spec);
        ELSIF spec = '{}' THEN
            RAISE EXCEPTION 'filter on %: empty operator object', to_json(col)::text
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        FOR op, val IN SELECT * FROM jsonb_each(spec) LOOP
            clause := clause || ' AND '
                || pgembed._condition_v1(col, typ, op, val, param, jsonb_array_length(args));
            -- A json or jsonb column (or a domain over one) takes any JSON value as it is.
            PERFORM pgembed._check_value_v1(col, typ, v)
                FROM jsonb_array_elements(CASE WHEN op = '$in' THEN val
                                               ELSE jsonb_build_array(val) END) v
                WHERE NOT json;
            args := args || jsonb_build_array(val);
        END LOOP;
    END LOOP;
END
$fn$;

-- A filter value that is not of its column's type, as an error that names the column (the cast
-- in the search would say only `invalid input syntax for type bigint: "eight"`).
CREATE OR REPLACE FUNCTION pgembed._check_value_v1(col text, typ text, val jsonb) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    -- `typ || ''`, not `typ`: pg_input_is_valid keeps the type of its first call when the type
    -- is a parameter, and PL/pgSQL keeps that state from one call of this function to the next.
    IF jsonb_typeof(val) <> 'null' AND NOT pg_input_is_valid(val #>> '{}', typ || '') THEN
        RAISE EXCEPTION 'filter on %: % is not a value of its type % (%)', to_json(col)::text,
            CASE WHEN length(val::text) > 60 THEN left(val::text, 59) || '…' ELSE val::text END,
            typ, (pg_input_error_info(val #>> '{}', typ || '')).message
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- Why a filter may match no row, when the statistics can tell (else NULL): a text value that no
-- row has, of a column whose values ANALYZE saw all of (its most common values cover every row:
-- a column of few distinct values, such as a category or a sentiment). One line that names the
-- column and its values, for a front end to show when a search returns nothing.
CREATE OR REPLACE FUNCTION pgembed.filter_note(model text, filter jsonb) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    m pgembed.models := pgembed._model_v1(model);
    col text;
    spec jsonb;
    wanted jsonb;
    known text[];
    missing text;
BEGIN
    IF jsonb_typeof(filter) IS DISTINCT FROM 'object' THEN
        RETURN NULL;
    END IF;
    FOR col, spec IN SELECT * FROM jsonb_each(filter) LOOP
        wanted := CASE WHEN jsonb_typeof(spec) IN ('string', 'number', 'boolean')
                       THEN jsonb_build_array(spec)
                       WHEN jsonb_typeof(spec -> '$eq') <> 'null' THEN jsonb_build_array(spec -> '$eq')
                       WHEN jsonb_typeof(spec -> '$in') = 'array' THEN spec -> '$in' END;
        -- A null among $in's values matches the NULL rows: not a value the table lacks.
        CONTINUE WHEN wanted IS NULL OR jsonb_array_length(wanted) = 0 OR wanted @> '[null]';
        SELECT s.most_common_vals::text::text[] INTO known
        FROM pg_stats s JOIN pg_attribute a
             ON a.attrelid = format('%I.%I', m.table_schema, m.table_name)::regclass
            AND a.attname = s.attname
        JOIN pg_type t ON t.oid = a.atttypid
        WHERE s.schemaname = m.table_schema AND s.tablename = m.table_name AND s.attname = col
          AND t.typcategory = 'S'  -- text values: their text is the value
          -- compared as text (citext's compare otherwise: _foreign_type_v1)
          AND NOT pgembed._foreign_type_v1(pgembed._base_type_v1(a.atttypid::regtype::text))
          AND s.most_common_vals IS NOT NULL
          AND (SELECT sum(f) FROM unnest(s.most_common_freqs) f) + s.null_frac >= 0.999;
        CONTINUE WHEN known IS NULL;
        SELECT string_agg(w::text, ', ') INTO missing
        FROM jsonb_array_elements(wanted) w WHERE NOT (w #>> '{}') = ANY (known);
        IF missing IS NOT NULL AND (SELECT count(*) FROM jsonb_array_elements(wanted) w
                                    WHERE (w #>> '{}') = ANY (known)) = 0 THEN
            RETURN format('no row has %s = %s (its values: %s)', to_json(col)::text, missing,
                          (SELECT string_agg(to_json(v)::text, ', ' ORDER BY v)
                           FROM unnest(known[1:20]) v)
                          || CASE WHEN cardinality(known) > 20 THEN ', ...' ELSE '' END);
        END IF;
    END LOOP;
    RETURN NULL;
END
$fn$;

-- A setting that counts rows (pgembed.exact_rows, pgembed.fulltext_rows): its value, else
-- `fallback` when unset or empty; anything but a number from 0 up is one clear error, not a cast's
-- message that names no setting (`abc`, `NaN`, `-5`).
CREATE OR REPLACE FUNCTION pgembed._rows_setting_v1(name text, fallback double precision)
RETURNS double precision
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    said text := btrim(current_setting(name, true));
BEGIN
    IF coalesce(said, '') = '' THEN
        RETURN fallback;
    END IF;
    IF said ~ '^\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$'
       AND said::numeric < 1e15 THEN
        RETURN said::double precision;
    END IF;
    RAISE EXCEPTION '% must be a number of rows from 0 up, not %', name, quote_literal(said)
        USING ERRCODE = 'invalid_parameter_value';
END
$fn$;

-- The filtered columns that no index leads with, on a table big enough for it to matter (else
-- NULL): one line that names them and the CREATE INDEX that helps, for a front end to show. A
-- filter that matches fewer than pgembed.exact_rows rows (default 20,000) is read exactly
-- (_path_v1): by a B-tree index on the filtered column when there is one, its cost growing with
-- the rows matched, else by scanning the whole table, its cost growing with the table. Below that
-- many rows (pg_class.reltuples; a table never counted gets no note), or with
-- pgembed.exact_rows = 0 (never read exactly), the scan is cheap enough or never made.
-- Any valid index whose first column is the column counts, unless partial (a later column of a
-- composite index, an expression index or a partial one cannot serve the filter alone).
CREATE OR REPLACE FUNCTION pgembed.filter_index_note(model text, filter jsonb) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    m pgembed.models := pgembed._model_v1(model);
    rel regclass := to_regclass(format('%I.%I', m.table_schema, m.table_name));
    cutoff double precision := pgembed._rows_setting_v1('pgembed.exact_rows', 20000);
    bare text[];
    tbl text := format('%I.%I', m.table_schema, m.table_name);
BEGIN
    IF jsonb_typeof(filter) IS DISTINCT FROM 'object' OR rel IS NULL OR cutoff <= 0
       OR (SELECT c.reltuples FROM pg_class c WHERE c.oid = rel) < cutoff THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(f.col ORDER BY a.attnum) INTO bare  -- in the table's order
    FROM jsonb_object_keys(filter) AS f(col)
    JOIN pg_attribute a ON a.attrelid = rel AND a.attname = f.col AND a.attnum > 0
                       AND NOT a.attisdropped
    WHERE NOT EXISTS (SELECT FROM pg_index i
                      WHERE i.indrelid = rel AND i.indisvalid AND i.indkey[0] = a.attnum
                        AND i.indpred IS NULL);
    IF bare IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN format('no index on %s %s, which the filter reads: %s %s selective filters fast', tbl,
                  (SELECT string_agg(format('(%I)', c), ', ' ORDER BY n)
                   FROM unnest(bare) WITH ORDINALITY AS u(c, n)),
                  (SELECT string_agg(format('CREATE INDEX ON %s (%I)', tbl, c), '; ' ORDER BY n)
                   FROM unnest(bare) WITH ORDINALITY AS u(c, n)),
                  CASE WHEN cardinality(bare) = 1 THEN 'makes' ELSE 'make' END);
END
$fn$;

-- Whether the caller chose `knob`: its value is neither pgvector's built-in one nor pgembed's own.
CREATE OR REPLACE FUNCTION pgembed._own_setting_v1(knob text, builtin text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT current_setting(knob, true) IS DISTINCT FROM builtin
       AND current_setting(knob, true) IS DISTINCT FROM
           current_setting('pgembed.applied_' || replace(knob, '.', '_'), true)
$fn$;

-- pgembed.ef_search when set (else NULL), checked here: hnsw.ef_search would refuse a bad value
-- under its own name, which the user never set.
CREATE OR REPLACE FUNCTION pgembed._ef_search_v1() RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    value text := nullif(current_setting('pgembed.ef_search', true), '');
    valid boolean := CASE WHEN value ~ '^[0-9]{1,4}$' THEN value::integer BETWEEN 1 AND 1000
                          ELSE false END;
BEGIN
    IF value IS NOT NULL AND NOT valid THEN
        RAISE EXCEPTION 'pgembed.ef_search must be a whole number from 1 to 1000, not %',
            to_json(value)::text USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN value;
END
$fn$;

-- {hnsw.ef_search, hnsw.iterative_scan, whose ef_search} for a search with this model:
-- pgembed.ef_search when set, else the caller's own values (the third element then says 'own':
-- used as they are), else the model's ef_search (NULL: none recorded; _effort_v1 makes the
-- default from the table's size and the filter's selectivity) and relaxed scans.
CREATE OR REPLACE FUNCTION pgembed._settings_v1(model text) RETURNS text[]
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT ARRAY[
        CASE WHEN nullif(current_setting('pgembed.ef_search', true), '') IS NOT NULL
             THEN pgembed._ef_search_v1()
             WHEN pgembed._own_setting_v1('hnsw.ef_search', '40')
             THEN current_setting('hnsw.ef_search', true)
             ELSE (SELECT m.ef_search::text FROM pgembed.models m WHERE m.name = model) END,
        CASE WHEN pgembed._own_setting_v1('hnsw.iterative_scan', 'off')
             THEN current_setting('hnsw.iterative_scan', true)
             ELSE 'relaxed_order' END,
        CASE WHEN nullif(current_setting('pgembed.ef_search', true), '') IS NOT NULL
                  OR pgembed._own_setting_v1('hnsw.ef_search', '40')
             THEN 'own' END]
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

-- A clear error for a bad k, a NULL query vector, one of the wrong dimensions or all zeros.
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
    IF 0 = ALL (query::real[]) THEN  -- its cosine distance to every row is NaN: any rows, unordered
        RAISE EXCEPTION 'the query vector is all zeros: it has no direction to compare'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$fn$;

-- Whether the row with this key has a text to embed (read only for a row without a vector: a
-- long text is not read at every similar(), nor a renamed text column needed by one that has).
CREATE OR REPLACE FUNCTION pgembed._row_has_text_v1(m pgembed.models, row_key text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    has_text boolean;  -- not `found`, which would hide PL/pgSQL's FOUND
BEGIN
    EXECUTE format('SELECT pgembed._has_text_v1(%s) FROM ONLY %I.%I t WHERE %s',
                   pgembed._text_v1(m.text_columns, 't'), m.table_schema, m.table_name,
                   pgembed._key_equal_v1(m.table_schema, m.table_name, m.key_column,
                                         format('t.%I', m.key_column), '$1'))
        INTO has_text USING row_key;
    RETURN coalesce(has_text, false);
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
    EXECUTE format('SELECT t.%I AS v FROM ONLY %I.%I t WHERE %s',
                   m.embedding_column, m.table_schema, m.table_name,
                   pgembed._key_equal_v1(m.table_schema, m.table_name, m.key_column,
                                         format('t.%I', m.key_column), '$1'))
        INTO found_row USING row_key;
    GET DIAGNOSTICS found = ROW_COUNT;
    IF found = 0 THEN
        RAISE EXCEPTION 'model %: table %.% has no row with % = %', m.name,
            quote_ident(m.table_schema), quote_ident(m.table_name), quote_ident(m.key_column),
            to_json(row_key)::text USING ERRCODE = 'no_data_found';
    ELSIF found_row.v IS NULL AND NOT pgembed._row_has_text_v1(m, row_key) THEN
        RAISE EXCEPTION 'model %: row % = % has no text to embed (blank or NULL), so no vector',
            m.name, quote_ident(m.key_column), to_json(row_key)::text
            USING ERRCODE = 'no_data_found';
    ELSIF found_row.v IS NULL THEN
        RAISE EXCEPTION 'model %: row % = % has no vector yet: run `pgembed sync`', m.name,
            quote_ident(m.key_column), to_json(row_key)::text USING ERRCODE = 'no_data_found';
    END IF;
    RETURN found_row.v;
END
$fn$;

-- Whether a search of this table without a filter is faster as an exact scan than by its HNSW
-- index: when it has fewer than 200 rows (pg_class.reltuples, kept by VACUUM, ANALYZE and CREATE
-- INDEX; a table never counted, -1, is taken as big). Not left to the planner: its cost of an
-- exact scan leaves out reading each row's vector back from TOAST, where rows with a long text
-- keep it, and it chose a scan several times slower than the index on tables of thousands of
-- such rows (BENCHMARKS.md, "The index or an exact scan").
CREATE OR REPLACE FUNCTION pgembed._exact_v1(rel regclass) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT coalesce(c.reltuples >= 0 AND c.reltuples < 200, false)
    FROM pg_class c WHERE c.oid = rel
$fn$;

-- The rule both defaults follow: 80 at 10,000 rows (or a table never counted, NULL), `growth`
-- times as much for each tenfold growth, between pgvector's 40 and its maximum 1000.
CREATE OR REPLACE FUNCTION pgembed._grown_ef_v1(rows double precision, growth double precision)
RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT least(1000, greatest(40, round(80 * power(coalesce(rows, 10000) / 10000.0,
                                                     log(growth)))))::integer
$fn$;

-- The default search effort (hnsw.ef_search) of an index search over `rows` rows, for a model
-- with none recorded (`pgembed tune` records one) whose graph was built with ef_construction 200
-- or more (a new model's default; see _graph_ef_v1 for sparser ones): 80 at 10,000 rows,
-- 2.6 times as much for each tenfold growth (208 at 100,000, 541 at 1,000,000; pgvector's 40
-- below some 1,900 rows; at most 1000), as an index's recall at a fixed ef_search falls as it
-- grows. Chosen for recall@10 >= 0.95 against exact search at 10k, 100k and 1M rows of review
-- passages (BENCHMARKS.md, "Search at scale"), with a margin: graphs built alike from the same
-- 1M rows measured 0.944-0.952 at ef_search 400-461 and 0.954-0.962 at 480. A table never
-- counted (NULL) gets 80.
CREATE OR REPLACE FUNCTION pgembed._default_ef_v1(rows double precision) RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT pgembed._grown_ef_v1(rows, 2.6)
$fn$;

-- The default ef_search for the table `rel` of a graph built sparser than _default_ef_v1
-- assumes (ef_construction below 200: pgvector's default 64, which older models were built
-- with): 3.5 times as much per tenfold from 80 at 10,000 rows (280 at 100,000, 980 at
-- 1,000,000), as its recall at 1M rows reached 0.95 only near ef_search 1000 (0.96 there; 0.92 at
-- 480, where the denser graph has 0.96). NULL for a denser graph: _default_ef_v1 applies.
CREATE OR REPLACE FUNCTION pgembed._graph_ef_v1(rel regclass, ef_construction integer)
RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT pgembed._grown_ef_v1(nullif(c.reltuples, -1), 3.5)
    FROM pg_class c WHERE c.oid = rel AND ef_construction < 200
$fn$;

-- The ef_construction the sparsest valid HNSW index on `rel` was built with (its reloption,
-- else pgvector's default 64), as built, whatever the catalog records; NULL without one.
CREATE OR REPLACE FUNCTION pgembed._built_ef_construction_v1(rel regclass) RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT min(coalesce((SELECT o.option_value::integer
                         FROM pg_options_to_table(c.reloptions) o
                         WHERE o.option_name = 'ef_construction'), 64))
    FROM pg_index i
    JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_am a ON a.oid = c.relam
    WHERE i.indrelid = rel AND i.indisvalid AND a.amname = 'hnsw'
$fn$;

-- The ef_search of an index search that pgembed chooses itself: the model's recorded one (else
-- the default above), divided by the share of rows the filter matches (`selectivity`, 1 without
-- a filter): the walk meets about 1/selectivity rows for each one it may keep. At least k (a
-- walk narrower than k finds k rows only by iterating), at most pgvector's 1000.
CREATE OR REPLACE FUNCTION pgembed._effort_v1(
    rows double precision, k integer, tuned integer, selectivity double precision
) RETURNS integer
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT least(1000, greatest(k, ceil(coalesce(tuned, pgembed._default_ef_v1(rows))
                                        / greatest(least(selectivity, 1), 0.001))))::integer
$fn$;

-- pgembed.search's choice without a filter: 0 (an exact scan) for a tiny table (_exact_v1), else
-- the ef_search of its index search.
CREATE OR REPLACE FUNCTION pgembed._index_effort_v1(rel regclass, k integer, tuned integer)
RETURNS integer
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT CASE WHEN c.reltuples >= 0 AND c.reltuples < 200 THEN 0
                ELSE pgembed._effort_v1(nullif(c.reltuples, -1), k, tuned, 1) END
    FROM pg_class c WHERE c.oid = rel
$fn$;

-- How many of the model's rows match `conditions` (" AND ..." on t.<column>, values in $1 as
-- _filter_v1 makes them, a tsquery in $2), by the planner's estimate: the statistics ANALYZE
-- keeps (pg_stats: most common values, histograms, a full-text index's most common words), with
-- the values known. Plans, reads no row.
CREATE OR REPLACE FUNCTION pgembed._planned_rows_v1(
    m pgembed.models, conditions text, args jsonb, words tsquery
) RETURNS double precision
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$  -- EXPLAIN needs VOLATILE
DECLARE
    plan json;
BEGIN
    EXECUTE format('EXPLAIN (FORMAT JSON) SELECT FROM ONLY %I.%I t WHERE true%s',
                   m.table_schema, m.table_name, conditions)
        INTO plan USING args, words;
    RETURN (plan -> 0 -> 'Plan' ->> 'Plan Rows')::double precision;
END
$fn$;

-- Whether more than `n` of the model's rows match `conditions` (as _planned_rows_v1), counted:
-- the rows are read until n + 1 are found, by bitmaps of the table's indexes (a full-text query
-- by the full-text index, which hands over the matching rows without their text being parsed
-- again). Not by a scan: the planner would read rows in order, parsing each one's text, until
-- n + 1 matched (`film or movie`, n = 5,000: 0.77 s on 50,000 reviews; 3-32 ms by the index, at
-- 50,000 reviews and at a million passages).
CREATE OR REPLACE FUNCTION pgembed._more_rows_than_v1(
    m pgembed.models, conditions text, args jsonb, words tsquery, n bigint
) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp SET enable_seqscan = off SET enable_indexscan = off AS $fn$
DECLARE
    found bigint;
BEGIN
    EXECUTE format('SELECT count(*) FROM (SELECT FROM ONLY %I.%I t WHERE true%s LIMIT $3) s',
                   m.table_schema, m.table_name, conditions)
        INTO found USING args, words, n + 1;
    RETURN found > n;
END
$fn$;

-- How many of the model's rows have a vector and match `conditions` (as _planned_rows_v1).
CREATE OR REPLACE FUNCTION pgembed._matching_v1(m pgembed.models, conditions text, args jsonb)
RETURNS double precision
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT pgembed._planned_rows_v1(
        m, format(' AND t.%I IS NOT NULL', m.embedding_column) || conditions, args, NULL)
$fn$;

-- Whether an index walk without a filter that gave `found` of the `wanted` rows may have missed
-- rows the caller may read, so that they are read exactly: under row-level security that applies
-- to the caller (the walk stops at hnsw.max_scan_tuples among rows it may not see); when it found
-- half of hnsw.max_scan_tuples or more (it may have stopped there: statistics taken before a
-- backfill say the column is all NULL); else when the statistics count more rows with a vector
-- than it found, by more than their error (a large k; none kept yet: maybe). Not when the table
-- has no more vectors (1M rows of which 30 have a text: no scan of 1M rows at each search).
CREATE OR REPLACE FUNCTION pgembed._came_short_v1(m pgembed.models, found integer, wanted bigint)
RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT found < wanted AND (
        row_security_active(format('%I.%I', m.table_schema, m.table_name))
        OR found >= coalesce(nullif(current_setting('hnsw.max_scan_tuples', true), '')::bigint,
                             20000) / 2
        OR coalesce((SELECT c.reltuples * (1 - s.null_frac) > found * 1.01 + 1
                     FROM pg_class c, pg_stats s
                     WHERE c.oid = format('%I.%I', m.table_schema, m.table_name)::regclass
                       AND c.reltuples >= 0
                       AND s.schemaname = m.table_schema AND s.tablename = m.table_name
                       AND s.attname = m.embedding_column AND NOT s.inherited), true))
$fn$;

-- How a search with `filter` reads the model's rows: 0, exactly (each matching row's distance,
-- the k nearest kept), else through the HNSW index with the ef_search returned.
-- - No filter: exactly below 200 rows (_exact_v1), else the index.
-- - A filter: exactly when the planner expects it to match fewer rows than pgembed.exact_rows
--   (default 20,000; a chunked model's rows count with their chunks): reading that many rows
--   (by a B-tree index on the filtered column, when there is one) costs a few milliseconds
--   and is exact, where an index walk would meet mostly rows the filter drops. Else the index,
--   with an effort scaled to the filter's selectivity (_effort_v1).
-- The caller's own ef_search (settings[3] = 'own', see _settings_v1) is used as it is.
CREATE OR REPLACE FUNCTION pgembed._path_v1(
    m pgembed.models, filter jsonb, k integer, settings text[]
) RETURNS integer
LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    rel regclass := format('%I.%I', m.table_schema, m.table_name)::regclass;
    chunks regclass;
    chunk_rows double precision;  -- the chunk table's reltuples (-1: never counted)
    total double precision;
    matching double precision;
    cutoff double precision;
    conditions text := '';
    args jsonb;
    selectivity double precision;
    efc integer := m.hnsw_ef_construction;
    walked regclass := rel;
BEGIN
    SELECT nullif(c.reltuples, -1) INTO total FROM pg_class c WHERE c.oid = rel;
    matching := total;
    IF m.long_texts = 'chunk' THEN
        chunks := pgembed._model_chunks_v1(m);
        SELECT c.reltuples INTO chunk_rows FROM pg_class c WHERE c.oid = chunks;
    END IF;
    IF filter IS NOT NULL AND jsonb_typeof(filter) <> 'null' THEN
        SELECT f.clause, f.args INTO conditions, args FROM pgembed._filter_v1(m, filter, 1) f;
    END IF;
    -- A filter ({} is none), or row-level security that applies to the caller: a policy is a
    -- filter the caller did not write (a tenant's rows), which the planner's estimate counts in.
    -- A walk sized for the whole table met half its rows hidden by a policy showing half, and
    -- found 0.94 of the visible top 10 at 1M rows.
    IF conditions <> '' OR row_security_active(rel) THEN
        matching := pgembed._matching_v1(m, conditions, args);
        cutoff := pgembed._rows_setting_v1('pgembed.exact_rows', 20000);
        IF matching * (1 + coalesce(greatest(chunk_rows, 0) / nullif(total, 0), 0)) < cutoff THEN
            RETURN 0;
        END IF;
    ELSIF pgembed._exact_v1(rel) AND (chunks IS NULL OR pgembed._exact_v1(chunks)) THEN
        RETURN 0;
    END IF;
    IF settings[3] = 'own' THEN
        RETURN settings[1]::integer;
    END IF;
    -- A chunked model's windows are walked in the chunk table's own graph: the effort is sized
    -- by the larger table, and by the sparser graph (`reindex --index-only` rebuilds only the
    -- rows' index, whose ef_construction the catalog records).
    selectivity := coalesce(matching / nullif(total, 0), 1);
    IF chunks IS NOT NULL THEN
        efc := least(efc, pgembed._built_ef_construction_v1(chunks));
        IF chunk_rows > coalesce(total, -1) THEN
            walked := chunks;
            total := chunk_rows;
        END IF;
    END IF;
    RETURN pgembed._effort_v1(total, k,
                              coalesce(settings[1]::integer, pgembed._graph_ef_v1(walked, efc)),
                              selectivity);
END
$fn$;

-- The same rows as _semantic_v1 (key as text, distance, settled) by an exact scan: every row
-- that meets `conditions` is read (by whatever index its conditions can use, never the HNSW one:
-- OFFSET 0 keeps the rows out of the index's order), the `lim` nearest kept, nearest first. A
-- chunked model's row by its best window, every chunk of the matching rows read.
CREATE OR REPLACE FUNCTION pgembed._scan_v1(m pgembed.models, conditions text, lim text)
RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF m.long_texts = 'chunk' AND pgembed._model_chunks_v1(m) IS NULL THEN
        RETURN pgembed._semantic_v1(m, conditions, lim, 1);  -- its error
    END IF;
    IF m.long_texts <> 'chunk' THEN
        RETURN format(
            'SELECT s.key, s.distance, true AS settled FROM (
                 SELECT t.%1$I::text AS key, t.%2$I %6$s $1 AS distance
                 FROM ONLY %3$I.%4$I t
                 WHERE t.%2$I IS NOT NULL%5$s
                 OFFSET 0) s
             ORDER BY s.distance
             LIMIT %7$s',
            m.key_column, m.embedding_column, m.table_schema, m.table_name, conditions,
            pgembed._distance_v1(), lim);
    END IF;
    RETURN format(
        'SELECT u.key, min(u.distance) AS distance, true AS settled FROM (
             SELECT t.%1$I::text AS key, t.%2$I %6$s $1 AS distance
             FROM ONLY %3$I.%4$I t
             WHERE t.%2$I IS NOT NULL%5$s
             UNION ALL
             SELECT t.%1$I::text, c.embedding %6$s $1
             FROM %8$s c JOIN ONLY %3$I.%4$I t ON %9$s
             WHERE t.%2$I IS NOT NULL%5$s) u
         GROUP BY u.key
         ORDER BY 2
         LIMIT %7$s',
        m.key_column, m.embedding_column, m.table_schema, m.table_name, conditions,
        pgembed._distance_v1(), lim, pgembed._model_chunks_v1(m),
        pgembed._key_equal_v1(m.table_schema, m.table_name, m.key_column,
                              format('t.%I', m.key_column), 'c.key'));
END
$fn$;

-- A chunked model's chunk table, pgembed_<name>_chunks beside its table, if it is pgembed's
-- (see _own_chunks_v1); else NULL.
CREATE OR REPLACE FUNCTION pgembed._model_chunks_v1(m pgembed.models) RETURNS regclass
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT pgembed._own_chunks_v1(
        format('%I.%I', m.table_schema, 'pgembed_' || m.name || '_chunks'))
$fn$;

-- The SQL of a model's nearest rows: `key` (as text), `distance` to the query $1 and `settled`,
-- nearest first, at most `lim` rows (an SQL expression) that meet `conditions` (" AND ..." on
-- t.<column>). A chunked model ranks a row by its best window: its own vector (the first window)
-- or a chunk of pgembed_<name>_chunks. Each of the two is an `ORDER BY ... <=> $1 LIMIT` of its
-- own, so each can take its HNSW index; the chunks' reads `depth` times deeper, since a row's
-- chunks can crowd each other. A row reached by a chunk is also measured by its own vector,
-- which the join reads anyway: the index walk over the rows may have missed it, and the chunk
-- alone would score it below its best window. `settled` says no unread chunk could change the
-- rows: the scan ran out of chunks, or its farthest is no nearer than the last row (else the
-- caller reads deeper). A chunk counts only while its row has a vector: a row whose text
-- changed waits for its new chunks with its new vector.
CREATE OR REPLACE FUNCTION pgembed._semantic_v1(
    m pgembed.models, conditions text, lim text, depth integer
) RETURNS text
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    chunks regclass;
BEGIN
    IF m.long_texts <> 'chunk' THEN
        RETURN format(
            'SELECT t.%1$I::text AS key, t.%2$I %6$s $1 AS distance, true AS settled
             FROM ONLY %3$I.%4$I t
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
             FROM ONLY %3$I.%4$I t
             WHERE t.%2$I IS NOT NULL%5$s
             ORDER BY t.%2$I %6$s $1
             LIMIT %7$s),
         pieces AS MATERIALIZED (
             SELECT t.%1$I::text AS key, c.embedding %6$s $1 AS distance,
                    t.%2$I %6$s $1 AS own_distance
             FROM %8$s c JOIN ONLY %3$I.%4$I t ON %10$s
             WHERE t.%2$I IS NOT NULL%5$s
             ORDER BY c.embedding %6$s $1
             LIMIT %9$s * (%7$s)::bigint),
         best AS MATERIALIZED (
             SELECT u.key, min(u.distance) AS distance
             FROM (SELECT * FROM own
                   UNION ALL SELECT p.key, least(p.distance, p.own_distance) FROM pieces p) u
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
        pgembed._distance_v1(), lim, chunks, depth,
        pgembed._key_equal_v1(m.table_schema, m.table_name, m.key_column,
                              format('t.%I', m.key_column), 'c.key'));
END
$fn$;

-- The `lim` rows nearest to `query` that meet `conditions` (" AND ..." on t.<column>, their
-- values $4 -> <slot>, `$3` a key to leave out), nearest first: keys and distances. By the index
-- when `effort` > 0 (the caller has set hnsw.ef_search): a chunked model's chunks are read deeper
-- until no unread one could change the rows (usually at once; 4^6 times lim chunks at most). By an
-- exact scan when the rows are few (effort 0), or when the walk gave fewer than `lim` rows: with a
-- filter (stale statistics, hnsw.max_scan_tuples reached), and without one where rows may have
-- been missed (_came_short_v1): `lim` rows whenever `lim` rows match. Without a
-- filter the walk takes the index whatever the planner's cost of a scan (sequential scans off,
-- see _exact_v1); the exact scan is planned as the planner likes. Every read sorts by
-- `distance + 0`: the planner takes an index scan's rows for sorted by distance and would skip
-- a sort by `distance` itself (PostgreSQL 16's presorted aggregates), but a relaxed-order
-- iterative scan (with a filter) returns near-ties out of order.
CREATE OR REPLACE FUNCTION pgembed._ranking_v1(
    m pgembed.models, conditions text, filtered boolean, effort integer, query vector, lim bigint,
    exclude_key text, args jsonb, OUT keys text[], OUT distances double precision[]
)
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    ranked constant text := 'SELECT array_agg(s.key ORDER BY s.distance + 0, s.key),
                                    array_agg(s.distance ORDER BY s.distance + 0, s.key)';
    depth integer := 4;
    settled boolean;
    seq text := current_setting('enable_seqscan');
BEGIN
    IF effort > 0 THEN
        IF NOT filtered THEN
            PERFORM set_config('enable_seqscan', 'off', true);
        END IF;
        LOOP
            EXECUTE format('%s, bool_and(s.settled) FROM (%s) s', ranked,
                           pgembed._semantic_v1(m, conditions, '$2', depth))
                INTO keys, distances, settled USING query, lim, exclude_key, args;
            EXIT WHEN settled IS NOT FALSE OR depth >= 4096;
            depth := depth * 4;
        END LOOP;
        PERFORM set_config('enable_seqscan', seq, true);
    END IF;
    IF effort = 0 OR (filtered AND coalesce(cardinality(keys), 0) < lim)
       OR (NOT filtered AND pgembed._came_short_v1(m, coalesce(cardinality(keys), 0), lim)) THEN
        EXECUTE format('%s FROM (%s) s', ranked, pgembed._scan_v1(m, conditions, '$2'))
            INTO keys, distances USING query, lim, exclude_key, args;
    END IF;
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
    effort integer;
    ranking record;
BEGIN
    PERFORM pgembed._check_query_v1(m, query, k);
    f := pgembed._filter_v1(m, filter, 4);
    IF exclude_key IS NOT NULL THEN
        not_self := format(' AND NOT %s',
                           pgembed._key_equal_v1(m.table_schema, m.table_name, m.key_column,
                                                 format('t.%I', m.key_column), '$3'));
    END IF;
    PERFORM pgembed._use_settings_v1(settings);
    -- An exact scan of the rows when they are few, else the index (_path_v1, _ranking_v1).
    effort := pgembed._path_v1(m, filter, k, settings);
    IF effort > 0 THEN
        PERFORM set_config('hnsw.ef_search', effort::text, true);
    END IF;
    SELECT * INTO ranking FROM pgembed._ranking_v1(
        m, not_self || f.clause, f.clause <> '', effort, query, k, exclude_key, f.args);
    -- Best first, whatever order the index scan gave them in (relaxed with a filter).
    RETURN QUERY SELECT u.key, 1 - u.distance
        FROM unnest(ranking.keys, ranking.distances) WITH ORDINALITY AS u(key, distance, n)
        ORDER BY u.n;
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
    lim bigint := greatest(4 * k::bigint, 40);  -- the rows each ranking reads
    effort integer;
    ranking record;
    words tsquery;
    common boolean := false;
    cutoff double precision;
    matches text;
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
    -- The full-text query, each term once: a repeated term matches the same rows, but ts_rank_cd
    -- pays for every copy (an audit's `film` 2,000 times: 96 s on 3,000 reviews; `film or film
    -- ...` x 128: 7.2 s on 25,000). websearch_to_tsquery writes an OR of ANDs of terms (a word,
    -- `!word`, a phrase `a <-> b`, as a hyphenated word or `o'reilly` makes), unparenthesised
    -- (AND binds tighter): each AND and the OR are taken as sets; a text it writes with
    -- parentheses is left as it is. At most 255 nodes (some 128 words): 300 distinct words took
    -- 0.4 s on 3,000 reviews, and hardly a row has so many words at once.
    words := websearch_to_tsquery('english', query_text);
    IF numnode(words) > 1 AND words::text !~ '[()]' THEN
        words := array_to_string(ARRAY(
            SELECT DISTINCT array_to_string(ARRAY(
                SELECT DISTINCT w FROM unnest(string_to_array(o, ' & ')) w ORDER BY w), ' & ')
            FROM unnest(string_to_array(words::text, ' | ')) o ORDER BY 1), ' | ')::tsquery;
    END IF;
    IF numnode(words) > 255 THEN
        RAISE EXCEPTION 'the query text makes a full-text query of % words and operators; '
            'hybrid search takes at most 255 (some 128 words): shorten it, or search without '
            'the full-text ranking', numnode(words) USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A query the full-text index cannot serve, one that matches rows by a word they lack
    -- (`-word`, `film or -bad`), would read nearly every row's text (`-zzzqqq`: 4.4 s on 25,000
    -- reviews) for a ranking of no word: the vector ranking alone ranks then (NULL matches no
    -- row, and the planner reads none).
    IF querytree(words) = 'T' THEN
        words := NULL;
    END IF;
    -- A query that matches more than pgembed.fulltext_rows rows (a word most rows have) ranks by
    -- its words only the vector ranking's rows: ranking every match reads each one's text
    -- (`film`: 5.4 s on 50,000 IMDb reviews, 29,736 of which have it), and a word that common
    -- finds no row worth adding to what the vectors found. The planner's estimate first (no row
    -- read); when it says more, a count that stops past the cutoff, since the estimate of a word
    -- the statistics do not list is a guess (at most 0.5 % of the rows: 5,000 at 1M, any word).
    IF words IS NOT NULL THEN
        f := pgembed._filter_v1(m, filter, 1);
        cutoff := pgembed._rows_setting_v1('pgembed.fulltext_rows', 5000);
        matches := format(' AND to_tsvector(''english'', %s) @@ $2',
                          pgembed._text_v1(m.text_columns, 't')) || f.clause;
        common := pgembed._planned_rows_v1(m, matches, f.args, words) > cutoff
                  AND pgembed._more_rows_than_v1(m, matches, f.args, words, floor(cutoff)::bigint);
    END IF;
    f := pgembed._filter_v1(m, filter, 4);
    PERFORM pgembed._use_settings_v1(settings);
    -- The vector ranking as _nearest_v1 reads it (_path_v1, _ranking_v1).
    effort := pgembed._path_v1(m, filter, least(lim, 1000)::integer, settings);
    IF effort > 0 THEN
        PERFORM set_config('hnsw.ef_search', effort::text, true);
    END IF;
    SELECT * INTO ranking
        FROM pgembed._ranking_v1(m, f.clause, f.clause <> '', effort, query, lim, NULL, f.args);
    RETURN QUERY EXECUTE format(
        'WITH semantic_rank AS (
             SELECT s.key, s.n AS rank
             FROM unnest($7::text[]) WITH ORDINALITY AS s(key, n)),
         lexical_rank AS (
             SELECT t.%1$I::text AS key,
                    row_number() OVER (ORDER BY ts_rank_cd(to_tsvector(''english'', %5$s), $5)
                                       DESC, t.%1$I) AS rank
             FROM ONLY %3$I.%4$I t%7$s
             WHERE to_tsvector(''english'', %5$s) @@ $5%6$s
             ORDER BY rank
             LIMIT $2)
         SELECT key, coalesce(1.0::float8 / (60 + s.rank), 0) + coalesce(1.0::float8 / (60 + l.rank), 0)
         FROM semantic_rank s FULL JOIN lexical_rank l USING (key)
         ORDER BY 2 DESC, s.rank NULLS LAST, l.rank NULLS LAST
         LIMIT $6',
        m.key_column, m.embedding_column, m.table_schema, m.table_name,
        pgembed._text_v1(m.text_columns, 't'), f.clause,
        -- A common query's rows: the vector ranking's, by the key's index (each key as its type).
        CASE WHEN common THEN format(' JOIN unnest($7::text[]) AS c(key) ON %s',
                                     pgembed._key_equal_v1(m.table_schema, m.table_name,
                                                           m.key_column,
                                                           format('t.%I', m.key_column), 'c.key'))
             ELSE '' END)
        -- $1-$4 as _ranking_v1 numbers them, for the filter's values at $4 (f.clause).
        USING query, lim, NULL::text, f.args, words, k, coalesce(ranking.keys, '{}');
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

COMMENT ON FUNCTION pgembed.similar(text, text, integer, jsonb) IS
    'The k rows nearest to the row with this key, the row itself excluded.';
COMMENT ON FUNCTION pgembed.filter_note(text, jsonb) IS
    'Why a filter may match no row, when the statistics can tell (a text value no row has), else NULL.';
COMMENT ON FUNCTION pgembed.filter_index_note(text, jsonb) IS
    'The filtered columns no index leads with, when the table is big enough for it to matter, '
    'with the CREATE INDEX that helps, else NULL.';
COMMENT ON FUNCTION pgembed.hybrid_search(text, vector, text, integer, jsonb) IS
    'Reciprocal-rank fusion of the vector ranking and a full-text ranking of the embedded text.';

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
--              %5$s pgvector's <=> by its schema; <inner> and <outer> make it the index
--              walk (<inner> `ORDER BY ... <=> query LIMIT 10` for k <= 10, or 100 for
--              10 < k <= 100: a constant the generic plan is costed for, as the raw statement
--              is) or the exact scan (<inner> `OFFSET 0`, <outer> `ORDER BY distance`).
--   $branch$   one model's WHEN arm.   %1$L model name, %2$s dimensions, %3$s its ef_search
--              (models.ef_search, else _graph_ef_v1's call for a graph built sparser, else
--              NULL; with two walks, first_walk_ef_search when k = 10), %4$s/%5$s
--              $nearest$'s walk with LIMIT 10/100,
--              %6$s pgvector's vector_dims by its schema, %7$L the table (for _index_effort_v1),
--              %8$s $nearest$'s exact scan, %9$s pgvector's vector_norm by its schema (a zero
--              query: the dynamic path's error), %10$s $second$ or nothing.
--   $second$   a model's second walk (`pgembed tune`'s two walks).  %1$s its
--              second_walk_mean_distance,
--              %2$L second_walk_ef_search, %3$s $nearest$'s walk with LIMIT 10.
--   $body$     the function body.      %s: every model's $branch$, in name order (or a
--              `WHEN NULL THEN NULL;` when there is no model).
-- The outer format() adds the signature (%s: the vector type, schema-qualified), the settings
-- every pgembed function pins (search_path; how keys are written as text) and the body
-- as a %L literal. tests/integration/snapshots/search_sample.sql shows what it generates for one
-- model, search_empty.sql for none.
------------------------------------------------------------------------------------------------

-- Rebuild pgembed.search from pgembed.models (only the triggers below and migrations call it).
CREATE OR REPLACE FUNCTION pgembed._compile_search_v1() RETURNS void
-- extra_float_digits: a cutoff distance is written into the function exactly, whoever compiles.
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET extra_float_digits = 3 AS $fn$
DECLARE
    m pgembed.models;
    branches text := '';
    nearest text;
    walk text;
    vector_type text;
    distance text;
    dims text;
    norm text;
    second text;
    tuned text;
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
           format('%I.vector_dims', n.nspname), format('%I.vector_norm', n.nspname)
    INTO vector_type, distance, dims, norm
    FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector';
    FOR m IN SELECT * FROM pgembed.models ORDER BY name LOOP
        IF m.long_texts = 'chunk' THEN  -- two indexes to merge: the dynamic path's statement
            branches := branches || format($chunked$
    WHEN %1$L THEN
        RETURN QUERY SELECT * FROM pgembed._nearest_v1(
            model, query, k, NULL, NULL, pgembed._settings_v1(model));$chunked$, m.name);
            CONTINUE;
        END IF;
        -- The first k rows, nearest first, into keys and similarities (validated identifiers
        -- cannot contain '<'): of the index walk, or of the exact scan, where OFFSET 0 keeps
        -- the subquery apart, so its rows cannot come in the index's order: every row is read
        -- once, its distance computed once, and the k nearest kept.
        nearest := format($nearest$
            SELECT array_agg(hits.key ORDER BY hits.distance),
                   array_agg(1 - hits.distance ORDER BY hits.distance)
            INTO keys, similarities FROM (
                SELECT found.* FROM (
                    SELECT t.%1$I::text AS key, t.%2$I %5$s query AS distance
                    FROM ONLY %3$I.%4$I t
                    WHERE t.%2$I IS NOT NULL
                    <inner>) found
                <outer>LIMIT k) hits;$nearest$,
            m.key_column, m.embedding_column, m.table_schema, m.table_name, distance);
        -- A sparser graph's default grows faster with the table (_graph_ef_v1).
        tuned := coalesce(m.ef_search::text,
                          CASE WHEN m.hnsw_ef_construction < 200
                               THEN format('pgembed._graph_ef_v1(%L, %s)',
                                           format('%I.%I', m.table_schema, m.table_name),
                                           m.hnsw_ef_construction) END,
                          'NULL');
        walk := replace(replace(nearest, '<outer>', ''), '<inner>',
                        format('ORDER BY t.%I %s query%sLIMIT <limit>', m.embedding_column,
                               distance, E'\n                    '));
        -- Two walks (`pgembed tune` records them, measured on the model's queries at k = 10):
        -- the first walk above was narrow; when its 10 rows are far from the query on average
        -- (second_walk_mean_distance or more: a query far from everything, where a narrow walk
        -- misses most of the true nearest rows), a wider walk replaces it. Not when the caller
        -- chose the effort (pgembed.ef_search, or their own hnsw.ef_search: unless the first
        -- walk set it, ef is NULL and the value the caller's), nor after a strict scan (the
        -- first walk came short: dead tuples).
        second := '';
        IF m.first_walk_ef_search IS NOT NULL THEN
            second := format($second$
            IF k = 10 AND cardinality(keys) = 10
               AND current_setting('hnsw.iterative_scan') = 'off'
               AND 1 - (SELECT avg(hit.near) FROM unnest(similarities) AS hit(near)) >= %1$s
               AND nullif(current_setting('pgembed.ef_search', true), '') IS NULL
               AND (ef IS NOT NULL OR NOT pgembed._own_setting_v1('hnsw.ef_search', '40')) THEN
                first_keys := keys;
                first_similarities := similarities;
                ef := coalesce(ef, current_setting('hnsw.ef_search'));
                done := set_config('hnsw.ef_search', %2$L, true);
                done := set_config('hnsw.iterative_scan', 'off', true);%3$s
                IF coalesce(cardinality(keys), 0) < k THEN
                    keys := first_keys;
                    similarities := first_similarities;
                END IF;
            END IF;$second$,
                m.second_walk_mean_distance, m.second_walk_ef_search,
                replace(replace(walk, '<limit>', '10'), E'\n            ', E'\n                '));
        END IF;
        branches := branches || format($branch$
    WHEN %1$L THEN
        -- The dynamic path, or its error; and under row-level security that applies to the
        -- caller, whose policy shows it some of the rows: the walk is sized by those (_path_v1).
        IF %6$s(query) <> %2$s OR k > 100 OR %9$s(query) = 0 OR row_security_active(%7$L) THEN
            RETURN QUERY SELECT * FROM pgembed._nearest_v1(
                model, query, k, NULL, NULL, pgembed._settings_v1(model));
            RETURN;
        END IF;
        -- A tiny table is read whole (below): faster there than its index, and exact (effort
        -- 0). Else the index, with the model's ef_search or one grown with the table
        -- (_index_effort_v1).
        effort := pgembed._index_effort_v1(%7$L, k, %3$s);
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
            -- rows. Iterating from the start cost 5-11 %% more (docs/decisions.md). An
            -- ef_search below k cannot give k rows in one walk: then the strict scan alone.
            scan := current_setting('hnsw.iterative_scan');
            -- The index, not an exact scan: the planner's cost of one leaves out reading each
            -- vector back from TOAST (see _exact_v1). Set before every run: a plan is made (or
            -- remade after an ANALYZE) when the statement runs.
            seq := current_setting('enable_seqscan');
            done := set_config('enable_seqscan', 'off', true);
            -- The inner LIMIT is a constant, so the one generic plan is costed for that many
            -- rows, as the raw statement is (a LIMIT parameter would be costed as 10 %% of the
            -- table, and sorting the table would win); the outer LIMIT stops the scan after k
            -- rows.
            FOREACH walking IN ARRAY ARRAY['off', 'strict_order'] LOOP
                CONTINUE WHEN walking = 'off' AND current_setting('hnsw.ef_search')::integer < k;
                EXIT WHEN coalesce(cardinality(keys), 0) >= k;
                done := set_config('hnsw.iterative_scan', walking, true);
                IF k <= 10 THEN%4$s
                ELSE%5$s
                END IF;
            END LOOP;%10$s
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
        IF exact THEN%8$s
        END IF;
        RETURN QUERY SELECT u.key, u.similarity
            FROM unnest(keys, similarities) WITH ORDINALITY AS u(key, similarity, n)
            ORDER BY u.n;$branch$,
            m.name, m.dimensions,
            CASE WHEN m.first_walk_ef_search IS NOT NULL
                 THEN format('CASE WHEN k = 10 THEN %s ELSE %s END', m.first_walk_ef_search,
                             tuned)
                 ELSE tuned END,
            replace(walk, '<limit>', '10'), replace(walk, '<limit>', '100'), dims,
            format('%I.%I', m.table_schema, m.table_name),
            replace(replace(nearest, '<inner>', 'OFFSET 0'), '<outer>', 'ORDER BY found.distance '),
            norm, second);
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

-- The trigger that reruns the compiler; SECURITY DEFINER, so whoever may change pgembed.models
-- (e.g. `pgembed tune` as another role) rebuilds the function as its owner.
CREATE OR REPLACE FUNCTION pgembed._recompile_search_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    PERFORM pgembed._compile_search_v1();
    RETURN NULL;
END
$fn$;
-- Not callable by PUBLIC: attached to another table it would rebuild pgembed.search at every write.
REVOKE EXECUTE ON FUNCTION pgembed._recompile_search_v1() FROM PUBLIC;

-- Every change to what the generated queries read (a model added, removed, renamed, switched to
-- a new version, tuned, or its index rebuilt with another ef_construction), deferred to the
-- commit: the rebuild sees the transaction's last state.
-- (Constraint triggers have no OR REPLACE: dropped and made again, in the same transaction.)
DROP TRIGGER IF EXISTS recompile_search ON pgembed.models;
CREATE CONSTRAINT TRIGGER recompile_search
AFTER INSERT OR DELETE OR UPDATE OF name, table_schema, table_name, key_column, embedding_column,
    dimensions, ef_search, long_texts, hnsw_ef_construction, first_walk_ef_search,
    second_walk_ef_search, second_walk_mean_distance
ON pgembed.models DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW EXECUTE FUNCTION pgembed._recompile_search_v1();
-- The same for TRUNCATE pgembed.models.
CREATE OR REPLACE TRIGGER recompile_search_truncate
AFTER TRUNCATE ON pgembed.models FOR EACH STATEMENT EXECUTE FUNCTION pgembed._recompile_search_v1();

-- Generate pgembed.search for the current catalog (its models, or none on a new install).
SELECT pgembed._compile_search_v1();

COMMENT ON FUNCTION pgembed.search(text, vector, integer, jsonb) IS
    'The k rows nearest to a query vector made by the model, nearest first (HNSW index).';
