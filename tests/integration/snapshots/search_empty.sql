-- pgembed.search with no model: pg_get_functiondef of pgembed.search(text, vector, integer, jsonb).
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
    WHEN NULL THEN NULL;
    ELSE  -- not a model: the dynamic path says so
        RETURN QUERY SELECT * FROM pgembed._nearest_v1(
            model, query, k, NULL, NULL, pgembed._settings_v1(model));
    END CASE;
END
$function$
