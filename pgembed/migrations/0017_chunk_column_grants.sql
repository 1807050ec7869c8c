-- pgembed 0017: a chunk table follows its watched table's column grants too. 0015's policy asked
-- only that the querying role may see the chunk's row (its key), so a role granted some columns
-- of the table but not the text nor the vector read every chunk's vector: semantic search over
-- text it may not read. Now the policy reads the row's vector column as that role, which
-- PostgreSQL then refuses, as it refuses the column itself (catalog/ddl.py follow_row_security
-- makes the same policy for new chunk tables). A chunk table that is gone or not pgembed's, or
-- whose table lost its key or vector column, is left alone (`pgembed reindex` makes it again).
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
        CONTINUE WHEN chunks IS NULL OR (
            SELECT pg_catalog.count(*) FROM pg_catalog.pg_attribute a
            WHERE a.attrelid = pg_catalog.to_regclass(
                      pg_catalog.format('%I.%I', m.table_schema, m.table_name))
              AND a.attname OPERATOR(pg_catalog.=) ANY (ARRAY[m.key_column, m.embedding_column])
              AND a.attnum > 0 AND NOT a.attisdropped) <> 2;
        -- The table before its chunk table, in the order `model remove` and alter-table take them.
        EXECUTE pg_catalog.format('LOCK TABLE %I.%I IN ACCESS SHARE MODE', m.table_schema,
                                  m.table_name);
        EXECUTE pg_catalog.format('DROP POLICY IF EXISTS pgembed_row_visible ON %s', chunks);
        EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', chunks);
        EXECUTE pg_catalog.format(
            'CREATE POLICY pgembed_row_visible ON %s USING (EXISTS ('
            'SELECT t.%I FROM %I.%I t WHERE t.%I OPERATOR(pg_catalog.=) %I.key))',
            chunks, m.embedding_column, m.table_schema, m.table_name, m.key_column,
            'pgembed_' || m.name || '_chunks');
    END LOOP;
END
$do$;
