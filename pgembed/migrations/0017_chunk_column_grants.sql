-- pgembed 0017: a chunk table follows its watched table's column grants too. 0015's policy asked
-- only that the querying role may see the chunk's row (its key), so a role granted some columns
-- of the table but not the text nor the vector read every chunk's vector: semantic search over
-- text it may not read. Now the policy reads the row's vector column as that role, which
-- PostgreSQL then refuses, as it refuses the column itself (catalog/ddl.py follow_row_security
-- makes the same policy for new chunk tables). A chunk table that is gone or not pgembed's
-- (_model_chunks_v1), or whose table lost its key or vector column (_missing_column_v1), is left
-- alone (`pgembed reindex` makes it again). Both functions exist since 0011, as chunked models do.
DO $do$
DECLARE
    m pgembed.models;
    rel regclass;
    chunks regclass;
BEGIN
    FOR m IN SELECT * FROM pgembed.models WHERE long_texts = 'chunk' LOOP
        rel := pg_catalog.to_regclass(pg_catalog.format('%I.%I', m.table_schema, m.table_name));
        chunks := pgembed._model_chunks_v1(m);
        CONTINUE WHEN rel IS NULL OR chunks IS NULL OR pgembed._missing_column_v1(
            rel, m.name, ARRAY[m.key_column, m.embedding_column]) IS NOT NULL;
        -- The table before its chunk table, in the order `model remove` and alter-table take them.
        EXECUTE pg_catalog.format('LOCK TABLE %s IN ACCESS SHARE MODE', rel);
        EXECUTE pg_catalog.format('DROP POLICY IF EXISTS pgembed_row_visible ON %s', chunks);
        EXECUTE pg_catalog.format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', chunks);
        EXECUTE pg_catalog.format(
            'CREATE POLICY pgembed_row_visible ON %s USING (EXISTS ('
            'SELECT t.%I FROM %s t WHERE t.%I OPERATOR(pg_catalog.=) %I.key))',
            chunks, m.embedding_column, rel, m.key_column, 'pgembed_' || m.name || '_chunks');
    END LOOP;
END
$do$;
