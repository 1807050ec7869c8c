-- pgembed 0015: a chunk table follows its watched table's grants and row-level security (issue
-- 26). Before, `model add` granted pgembed_reader SELECT on every pgembed_<model>_chunks, and a
-- role the table's policy showed only some rows read every row's chunks. Now a chunk is visible
-- only while the querying role may see its row (catalog/ddl.py follow_row_security makes the
-- same policy for new chunk tables). The owner of schema pgembed owns the chunk tables and runs
-- this migration; a chunk table that is gone, not pgembed's, or whose table lost its key column
-- is left alone (`pgembed reindex` makes it again, with the policy).
DO $do$
DECLARE
    m record;
    chunks regclass;
BEGIN
    FOR m IN SELECT * FROM pgembed.models WHERE long_texts = 'chunk' LOOP
        SELECT c.oid INTO chunks FROM pg_catalog.pg_class c
        WHERE c.oid = pg_catalog.to_regclass(
                  pg_catalog.format('%I.%I', m.table_schema, 'pgembed_' || m.name || '_chunks'))
          AND c.relkind = 'r'
          AND c.relowner = (SELECT n.nspowner FROM pg_catalog.pg_namespace n
                            WHERE n.nspname = 'pgembed');
        CONTINUE WHEN chunks IS NULL OR NOT EXISTS (
            SELECT FROM pg_catalog.pg_attribute a
            WHERE a.attrelid = pg_catalog.to_regclass(
                      pg_catalog.format('%I.%I', m.table_schema, m.table_name))
              AND a.attname = m.key_column AND a.attnum > 0 AND NOT a.attisdropped);
        CONTINUE WHEN EXISTS (SELECT FROM pg_catalog.pg_policy p
                              WHERE p.polrelid = chunks AND p.polname = 'pgembed_row_visible');
        EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', chunks);
        EXECUTE pg_catalog.format(
            'CREATE POLICY pgembed_row_visible ON %s USING (EXISTS ('
            'SELECT FROM %I.%I t WHERE t.%I OPERATOR(pg_catalog.=) %I.key))',
            chunks, m.table_schema, m.table_name, m.key_column,
            'pgembed_' || m.name || '_chunks');
    END LOOP;
END
$do$;
