-- pgembed 0016: a new model's HNSW graph is built with ef_construction 200, not pgvector's 64
-- (issue 23): at a million rows it reaches recall@10 0.95 at some 2.5 times less search effort.
-- pgembed always names the value it builds with (catalog/registry.py); the column's default
-- says the same for a row written by hand. Existing models keep their graphs, and their searches
-- the default effort of a sparser graph (pgembed._graph_ef_v1).
ALTER TABLE pgembed.models ALTER COLUMN hnsw_ef_construction SET DEFAULT 200;
