-- pgembed 0018: `pgembed tune` may record two walks for a model's unfiltered searches of 10 rows
-- (issue 23): a narrow first walk, and a second, wider one only when the first walk's 10 rows
-- are at a mean cosine distance of `second_walk_mean_distance` or more from the query: a query
-- far from everything, where a narrow walk misses most. The cutoff is a distance of the model's
-- own space, so it is measured, never assumed: NULL (one walk) until tune records it.
ALTER TABLE pgembed.models
    ADD COLUMN first_walk_ef_search integer,
    ADD COLUMN second_walk_ef_search integer,
    ADD COLUMN second_walk_mean_distance double precision,
    ADD CONSTRAINT models_two_walks_check CHECK (
        (first_walk_ef_search IS NULL) = (second_walk_ef_search IS NULL)
        AND (first_walk_ef_search IS NULL) = (second_walk_mean_distance IS NULL)
        AND first_walk_ef_search >= 1 AND first_walk_ef_search < second_walk_ef_search
        AND second_walk_ef_search <= 1000 AND second_walk_mean_distance BETWEEN 0 AND 2);
