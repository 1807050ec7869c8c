-- pgembed's SQL definitions (3 of 3): the sync daemon's write of a table's vectors as the table's
-- owner. The one definition: `pgembed migrate` re-applies this file (CREATE OR REPLACE) after the
-- run-once migrations whenever it changed. See 20_capture.sql for the rules.
--
-- PostgreSQL runs a table's triggers, rules and policies as whoever writes the table; the daemon
-- writes every watched table, so it writes one owned by another role (not a superuser, not the
-- daemon's login) as that owner (pgembed/catalog/trust.py says when, docs/security.md why). Only
-- a SECURITY DEFINER function owned by the table's owner runs the owner's code as the owner with
-- no way back to the daemon's role (PostgreSQL refuses SET ROLE and SET SESSION AUTHORIZATION in
-- one). No permanent function can be that: its owner is one role, and a table's owner may
-- create in no schema of pgembed's. So pgembed._write_as_owner_v1 makes the writer in this
-- session's temporary schema, the one schema both the daemon and the owner may create in (they
-- need TEMPORARY on the database), inside the write's transaction (no other session sees it
-- before the commit, nor may use that schema after), gives it to the owner (the daemon must be
-- able to SET ROLE to it), and calls it once. The writer is dropped with the session's
-- temporary objects right after the commit: the daemon's pgembed/sync/store.py (clean_session)
-- also undoes whatever else the owner's code left in the session.

-- Write `embeddings` to the rows of `keys` whose md5(text) is still `text_md5s`, as `owner`, by
-- `query`: the daemon's UPDATE of the table (composed in pgembed/sync/store.py with
-- psycopg.sql.Identifier, its rows $1, $2, $3: keys, md5s, vectors), counting the rows written.
-- `tbl` names the table in errors. It runs as the caller (SECURITY INVOKER): anything it does the
-- caller could do by SET ROLE to the owner, which ALTER FUNCTION ... OWNER TO requires. It must be
-- the transaction's last statement, and the caller's session cleaned after its commit.
-- The writer:
-- - runs as the owner (SECURITY DEFINER) with pinned settings: search_path (pg_catalog first,
--   pg_temp last) and those that shape text (datestyle, ..., row_security on);
-- - sets pgembed.writing so the capture trigger takes the vectors for the daemon's (not a SET
--   clause: PostgreSQL lets only a superuser's function set a custom parameter so);
-- - runs SET CONSTRAINTS ALL IMMEDIATE before and after the write, so the owner's deferrable
--   constraint triggers fire inside, as the owner, not at the commit as the daemon;
-- - refuses a write that changed a table with a deferrable trigger (the owner's code may defer
--   one again; PostgreSQL lets SQL neither see that queue nor fire it here), or left a cursor
--   WITH HOLD (its query would run at the commit, as the daemon), or wrote fewer rows than were
--   locked unchanged (pgembed/sync/store.py's lock): the owner's triggers, rules or policies kept
--   vectors out, which fails the batch rather than lose its keys.
CREATE OR REPLACE FUNCTION pgembed._write_as_owner_v1(
    owner text, tbl text, query text, keys text[], text_md5s text[], embeddings anyarray)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    CREATE FUNCTION pg_temp.pgembed_write_as_owner(
        tbl pg_catalog.text, query pg_catalog.text, keys pg_catalog.text[],
        text_md5s pg_catalog.text[], embeddings anyarray)
    RETURNS void LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    SET datestyle = 'ISO, MDY' SET intervalstyle = 'postgres' SET timezone = 'UTC'
    SET extra_float_digits = 1 SET bytea_output = 'hex' SET row_security = on
    AS $writer$
    DECLARE
        written bigint;
        deferred text;
        held text;
    BEGIN
        PERFORM pg_catalog.set_config('pgembed.writing', 'on', true);
        SET CONSTRAINTS ALL IMMEDIATE;
        EXECUTE query INTO written USING keys, text_md5s, embeddings;
        SET CONSTRAINTS ALL IMMEDIATE;
        -- The changed tables are the statistics' counts of this transaction: without them
        -- (track_counts off, a superuser's setting) none is seen, so nothing is written.
        IF pg_catalog.current_setting('track_counts') OPERATOR(pg_catalog.=) 'off' THEN
            RAISE EXCEPTION 'pgembed: % is written as its owner %, which needs track_counts on '
                '(to see the tables the owner''s code changed): not written', tbl, CURRENT_USER;
        END IF;
        -- Foreign keys' triggers aside: they check as the table's owner.
        SELECT pg_catalog.string_agg(DISTINCT s.relid::pg_catalog.regclass::pg_catalog.text, ', ')
        INTO deferred
        FROM pg_catalog.pg_stat_xact_all_tables s
        JOIN pg_catalog.pg_trigger g ON g.tgrelid OPERATOR(pg_catalog.=) s.relid
        JOIN pg_catalog.pg_proc f ON f.oid OPERATOR(pg_catalog.=) g.tgfoid
        WHERE g.tgdeferrable
          AND NOT (f.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
                   AND f.proname OPERATOR(pg_catalog.~~) 'RI\_FKey\_%')
          AND s.n_tup_ins OPERATOR(pg_catalog.+) s.n_tup_upd OPERATOR(pg_catalog.+) s.n_tup_del
              OPERATOR(pg_catalog.>) 0;
        IF deferred IS NOT NULL THEN
            RAISE EXCEPTION 'pgembed: writing % as its owner % changed % whose deferrable '
                'triggers would fire at the commit as the daemon: not written (make them NOT '
                'DEFERRABLE)', tbl, CURRENT_USER, deferred;
        END IF;
        -- PostgreSQL refuses a cursor WITH HOLD only in a security-restricted operation. The
        -- daemon declares none, so any here is the owner's code's: the rollback drops it unrun.
        SELECT pg_catalog.string_agg(c.name, ', ') INTO held
        FROM pg_catalog.pg_cursors c WHERE c.is_holdable;
        IF held IS NOT NULL THEN
            RAISE EXCEPTION 'pgembed: writing % as its owner % left cursors WITH HOLD (%) whose '
                'queries would run at the commit as the daemon: not written',
                tbl, CURRENT_USER, held;
        END IF;
        IF written OPERATOR(pg_catalog.<>) pg_catalog.cardinality(keys) THEN
            RAISE EXCEPTION 'pgembed: % of % vectors were kept from being written to %: the '
                'table''s own triggers, rules or row-level security refused them (as its owner %)',
                pg_catalog.cardinality(keys) OPERATOR(pg_catalog.-) written,
                pg_catalog.cardinality(keys), tbl, CURRENT_USER;
        END IF;
    END
    $writer$;
    -- Any role may EXECUTE the writer (the default), but no other session may use this one's
    -- temporary schema (superusers aside), and the owner's code inside runs as the owner anyway.
    EXECUTE pg_catalog.format('ALTER FUNCTION pg_temp.pgembed_write_as_owner(pg_catalog.text, '
        'pg_catalog.text, pg_catalog.text[], pg_catalog.text[], anyarray) OWNER TO %I', owner);
    -- Nothing of the caller's may come after: the owner's code may have left traps in the session.
    EXECUTE 'SELECT pg_temp.pgembed_write_as_owner($1, $2, $3, $4, $5)'
        USING tbl, query, keys, text_md5s, embeddings;
END
$fn$;
-- The sync daemon's (sql/roles.sql grants it to pgembed_daemon): nobody else writes vectors.
REVOKE EXECUTE ON FUNCTION pgembed._write_as_owner_v1(text, text, text, text[], text[], anyarray)
    FROM PUBLIC;
