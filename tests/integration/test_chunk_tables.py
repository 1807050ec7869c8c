"""Chunked models on tables of each test's own: a big table of random vectors, rows crowded out by
another row's chunks, hybrid and search reading the chunks as deep, a row scored by its own
vector too, and the names a chunk table may not take (the shared long reviews:
test_chunks.py)."""

from __future__ import annotations

import numpy as np
import pytest
from pgvector import Vector as PgVector
from psycopg import sql

import pgembed
from helpers import cli, hnsw_built_after, plans, writing_vectors
from pgembed import db
from pgembed.catalog import registry
from pgembed.errors import UsageError
from pgembed.lifecycle import models, status, switch
from pgembed.search import topk


def test_a_big_table_searches_both_indexes_and_filters_return_k(db_url: str) -> None:
    """3,000 rows and 6,000 chunks of random unit vectors, written directly: big enough for the
    HNSW indexes, and a filter that keeps 2 % of the rows still yields k of them."""
    rng = np.random.default_rng(11)
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE items (id integer PRIMARY KEY, body text, bucket text)")
        request = models.AddRequest("big", "items", "body", precision="fp32", long_texts="chunk")
        spec = models.add(conn, request)[0]

        def unit(n: int) -> np.ndarray:
            v = rng.normal(size=(n, spec.dimensions)).astype(np.float32)
            return np.asarray(v / np.linalg.norm(v, axis=1, keepdims=True))

        with hnsw_built_after(conn, "items", "pgembed_big_chunks"):
            copy = "COPY items (id, body, bucket, embedding_big) FROM STDIN (FORMAT BINARY)"
            with writing_vectors(conn), conn.cursor() as cur, cur.copy(copy) as out:
                out.set_types(["integer", "text", "text", "vector"])
                for i, vector in enumerate(unit(3000)):
                    bucket = "rare" if i % 50 == 0 else "common"
                    out.write_row((i, f"item {i}", bucket, PgVector(vector)))
            copy = "COPY pgembed_big_chunks (key, chunk, embedding) FROM STDIN (FORMAT BINARY)"
            with conn.cursor() as cur, cur.copy(copy) as out:
                out.set_types(["integer", "integer", "vector"])
                for i, vector in enumerate(unit(6000)):
                    out.write_row((i // 2, 1 + i % 2, PgVector(vector)))
        conn.execute("DELETE FROM pgembed.inbox")  # the vectors are already there
        conn.execute("ANALYZE items")
        conn.execute("ANALYZE pgembed_big_chunks")
        query = PgVector(unit(1)[0])
        with plans(conn) as found:
            hits = conn.execute("SELECT key FROM pgembed.search('big', %s, 10)", (query,))
            assert len(hits.fetchall()) == 10
        joined = "\n".join(found)
        assert "pgembed_big_hnsw" in joined and "pgembed_big_hnswc" in joined
        # Random vectors are HNSW's hardest case: with a deep enough scan, the exact rows.
        conn.execute("SET pgembed.ef_search = 1000")
        deep = conn.execute("SELECT key FROM pgembed.search('big', %s, 10)", (query,))
        exact = topk.exact(conn, spec, np.asarray([query.to_numpy()]), 10)[0]
        assert [k for (k,) in deep] == exact
        rare = conn.execute(
            "SELECT key FROM pgembed.search('big', %s, 10, '{\"bucket\": \"rare\"}')", (query,)
        ).fetchall()
        assert len(rare) == 10 and all(int(k) % 50 == 0 for (k,) in rare)


def test_rows_crowded_out_by_another_rows_chunks_are_still_found(db_url: str) -> None:
    """One row's many near chunks fill the first 4·k chunks read: the search reads deeper
    until no unread chunk could change the k rows, and matches the exact ranking."""
    volcano = "The volcano erupted and lava poured down from the crater into the valley. "
    texts = {
        1: volcano * 300,  # one topic, many windows, all near the query
        2: "Boil the pasta in salted water and stir the sauce slowly. " * 30
        + "Later that year the volcano erupted: lava, ash and a glowing crater.",
        **{k: f"Geology note {k}: rocks, soil and the slow work of rivers." for k in range(3, 16)},
    }
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE notes (id integer PRIMARY KEY, body text)")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO notes VALUES (%s, %s)", list(texts.items()))
        request = models.AddRequest("notes", "notes", "body", precision="fp32", long_texts="chunk")
        spec = models.add(conn, request)[0]
    pgembed.sync_once(database_url=db_url)
    with pgembed.Client(db_url) as client, db.connection(db_url) as conn:
        query = client.embed("notes", ["volcanic eruption, lava and crater"], queries=True)
        # The 4·k = 12 chunks nearest to the query are all row 1's.
        crowd = conn.execute(
            "SELECT count(DISTINCT key) FROM (SELECT key FROM pgembed_notes_chunks "
            "ORDER BY embedding <=> %s LIMIT 12) c",
            (PgVector(query[0]),),
        ).fetchone()
        assert crowd == (1,)
        exact = topk.exact(conn, spec, query, 3)[0]
        assert [
            str(h.key) for h in client.search("notes", "volcanic eruption, lava and crater", k=3)
        ] == exact
        assert exact[:1] == ["1"] and "2" in exact
        # k far past any table: no integer overflow in the chunk scan's limit.
        rows = conn.execute(
            "SELECT count(*) FROM pgembed.search('notes', %s, 600000000)", (PgVector(query[0]),)
        ).fetchone()
        assert rows == (15,)


def test_hybrid_reads_the_chunks_as_deep_as_search_does(db_url: str) -> None:
    """Ten rows' 200 chunks, all nearer the query than row 11's one chunk, fill the 4·40 chunks
    hybrid search read once: row 11, 11th in the vector ranking, was missing from it and fused
    as a text match only. Vectors written directly, placed around the query."""
    rng = np.random.default_rng(5)
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE items (id integer PRIMARY KEY, body text)")
        request = models.AddRequest(
            "deep", "items", "body", precision="fp32", long_texts="chunk", fulltext=True
        )
        spec = models.add(conn, request)[0]
        query = rng.normal(size=spec.dimensions)
        query /= np.linalg.norm(query)

        def near(spread: float) -> PgVector:
            """A unit vector at cosine 1/sqrt(1 + spread²) from the query."""
            away = rng.normal(size=spec.dimensions)
            away -= (away @ query) * query
            vector = query + spread * away / np.linalg.norm(away)
            return PgVector((vector / np.linalg.norm(vector)).astype(np.float32))

        rows = [(i, f"crowd {i}", near(3.0)) for i in range(1, 11)]
        rows.append((11, "the volcano erupted", near(5.0)))  # past the 40 nearest own vectors
        rows += [(i, f"filler {i}", near(1.0 + i / 50)) for i in range(100, 160)]
        chunks = [(i, n, near(0.25)) for i in range(1, 11) for n in range(1, 21)]
        chunks.append((11, 1, near(0.6)))
        with writing_vectors(conn), conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO items (id, body, embedding_deep) VALUES (%s, %s, %s)", rows
            )
            cur.executemany("INSERT INTO pgembed_deep_chunks VALUES (%s, %s, %s)", chunks)
        conn.execute("DELETE FROM pgembed.inbox")  # the vectors are already there
        conn.execute("SET pgembed.exact_rows = 0")  # the index walk, not the rows read exactly
        vector = PgVector(query.astype(np.float32))
        exact = topk.exact(conn, spec, np.asarray([query]), 40)[0]
        assert exact.index("11") == 10  # after the ten crowding rows
        ranked = conn.execute("SELECT key FROM pgembed.search('deep', %s, 40)", (vector,))
        assert [key for (key,) in ranked] == exact
        fused = conn.execute(
            "SELECT key, score FROM pgembed.hybrid_search('deep', %s, 'volcano', 3)", (vector,)
        ).fetchall()
        assert fused[0] == ("11", pytest.approx(1 / (60 + 11) + 1 / (60 + 1)))


def test_a_row_reached_by_its_chunk_is_scored_by_its_own_vector_too(db_url: str) -> None:
    """A walk of the rows' index that misses a row's own vector, when one of its chunks is read:
    the row came back with the chunk's similarity, below its own vector's. 3,000 random rows and
    a shallow walk (ef_search 10) miss many."""
    rng = np.random.default_rng(13)
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE items (id integer PRIMARY KEY, body text)")
        request = models.AddRequest(
            "shallow", "items", "body", precision="fp32", long_texts="chunk"
        )
        spec = models.add(conn, request)[0]
        vectors = rng.normal(size=(3000, spec.dimensions)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        with hnsw_built_after(conn, "items", "pgembed_shallow_chunks"):
            copy = "COPY items (id, body, embedding_shallow) FROM STDIN (FORMAT BINARY)"
            with writing_vectors(conn), conn.cursor() as cur, cur.copy(copy) as out:
                out.set_types(["integer", "text", "vector"])
                for i, vector in enumerate(vectors):
                    out.write_row((i, f"item {i}", PgVector(vector)))
            copy = "COPY pgembed_shallow_chunks (key, chunk, embedding) FROM STDIN (FORMAT BINARY)"
            with conn.cursor() as cur, cur.copy(copy) as out:
                out.set_types(["integer", "integer", "vector"])
                for i, vector in enumerate(vectors):  # a window much like the first
                    near = vector + 0.2 * rng.normal(size=spec.dimensions) / spec.dimensions**0.5
                    chunk = (near / np.linalg.norm(near)).astype(np.float32)
                    out.write_row((i, 1, PgVector(chunk)))
        conn.execute("DELETE FROM pgembed.inbox")
        conn.execute("ANALYZE items")
        conn.execute("ANALYZE pgembed_shallow_chunks")
        conn.execute("SET pgembed.ef_search = 10")
        below = 0
        for row in rng.choice(3000, 30, replace=False):  # queries near rows
            query = vectors[row] + 0.8 * rng.normal(size=spec.dimensions) / spec.dimensions**0.5
            hits = conn.execute(
                "SELECT key::integer, similarity FROM pgembed.search('shallow', %s, 10)",
                (PgVector(query / np.linalg.norm(query)),),
            ).fetchall()
            own = vectors[[key for key, _ in hits]] @ (query / np.linalg.norm(query))
            below += sum(s < o - 1e-6 for (_, s), o in zip(hits, own.tolist(), strict=True))
        assert below == 0


def test_bad_requests_are_refused_and_tables_of_others_left_alone(db_url: str) -> None:
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE docs (id integer PRIMARY KEY, body text)")
        conn.execute("CREATE TABLE pgembed_t_chunks (important text)")  # the user's, by chance
        conn.execute("INSERT INTO pgembed_t_chunks VALUES ('user data')")
    base = ("--database-url", db_url, "model", "add")
    # The name is taken: one line that says what to do, nothing made.
    result = cli(*base, "t", "--table", "docs", "--column", "body", "--long-texts", "chunk")
    assert result.exit_code == 2 and "pgembed_t_chunks exists" in result.output, result.output
    # Windows too small to mean anything.
    result = cli(*base, "tiny", "--table", "docs", "--column", "body", "--long-texts", "chunk",
                 "--max-seq-length", "20")  # fmt: skip
    assert result.exit_code == 2 and "too small" in result.output, result.output
    # A model that truncates never touches a table of that name: remove and reindex leave it.
    result = cli(*base, "t", "--table", "docs", "--column", "body", "--precision", "fp32")
    assert result.exit_code == 0, result.output
    assert cli("--database-url", db_url, "reindex", "t").exit_code == 0
    assert cli("--database-url", db_url, "model", "remove", "t").exit_code == 0
    with db.connection(db_url) as conn:
        kept = conn.execute("SELECT important FROM pgembed_t_chunks").fetchall()
        assert kept == [("user data",)]
        assert conn.execute("SELECT count(*) FROM pgembed.models").fetchone() == (0,)


@pytest.mark.parametrize("schema", ["public", "Sales"])
def test_a_reindex_into_chunks_refuses_names_another_object_holds(db_url: str, schema: str) -> None:
    """A type or an index name of the chunk table taken: `model alter --long-texts chunk` refuses
    at once, naming it, instead of embedding every row for a switch that fails (an audit's enum
    `pgembed_tm_chunks` left the shadow behind), in a schema of capitals too (a review's)."""
    where = sql.Identifier(schema)
    with db.connection(db_url) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(where))
        conn.execute(
            sql.SQL("CREATE TABLE {}.docs (id integer PRIMARY KEY, body text)").format(where)
        )
        conn.execute(sql.SQL("INSERT INTO {}.docs VALUES (1, 'a review')").format(where))
        models.add(conn, models.AddRequest("tm", f"{schema}.docs", "body", precision="fp32"))
        for squat, name in (
            ("TYPE {}.pgembed_tm_chunks AS ENUM ('x')", "pgembed_tm_chunks"),
            ("TABLE {}.pgembed_tm_ckey (x integer)", "pgembed_tm_ckey"),
            ("TABLE {}.pgembed_tm_chunks (x integer)", "pgembed_tm_chunks"),  # this role's
        ):
            conn.execute(sql.SQL("CREATE " + squat).format(where))
            result = cli("--database-url", db_url, "model", "alter", "tm", "--long-texts", "chunk")
            assert result.exit_code == 2, result.output
            taken = f"{schema}.{name}, a name of its chunk table or its indexes, is taken"
            assert taken in result.output, result.output
            assert registry.shadow(conn, "tm") is None
            conn.execute(sql.SQL("DROP " + squat.split(" (")[0].split(" AS ")[0]).format(where))
        result = cli("--database-url", db_url, "model", "alter", "tm", "--long-texts", "chunk")
        assert result.exit_code == 0, result.output


def test_a_name_taken_while_a_reindex_into_chunks_runs_stops_it_before_the_switch(
    db_url: str,
) -> None:
    """A name the switch will give the shadow's chunk table or index, taken after the reindex
    began: status marks the reindex broken and the daemon leaves it, `pgembed reindex` stops at
    once saying why (it embedded every row, then failed at the switch with `type ... already
    exists`), and a switch that meets one refuses in the same words; freed, the reindex ends."""
    url = ("--database-url", db_url)
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE docs (id integer PRIMARY KEY, body text)")
        conn.execute("INSERT INTO docs VALUES (1, 'a review'), (2, 'another review')")
        models.add(conn, models.AddRequest("tm", "docs", "body", precision="fp32"))
        assert pgembed.sync_once(database_url=db_url).written == 2
        started = cli(*url, "model", "alter", "tm", "--long-texts", "chunk", "--no-wait")
        assert started.exit_code == 0, started.output
        # A table of pgembed's own owner (this role): not the model's chunk table, which it
        # has none of yet (a review's; an enum was found, such a table was not).
        conn.execute("CREATE TABLE pgembed_tm_chunks (x integer)")
        taken = "public.pgembed_tm_chunks, a name of its chunk table or its indexes, is taken"
        (report,) = status.all_status(conn)
        assert taken in report["reindex"]["broken"], report
        assert pgembed.sync_once(database_url=db_url).written == 0
        stopped = cli(*url, "reindex", "tm")
        assert stopped.exit_code == 2, stopped.output
        assert f"the reindex of tm cannot go on: {taken}" in stopped.output
        conn.execute("DROP TABLE pgembed_tm_chunks")
        assert pgembed.sync_once(database_url=db_url).written == 2  # the shadow, filled
        for squat in ("TABLE pgembed_tm_chunks (x integer)", "TYPE pgembed_tm_hnswc AS ENUM ()"):
            conn.execute("CREATE " + squat)
            with pytest.raises(UsageError, match="a name of its chunk table or its indexes"):
                switch.swap_in(conn, "tm")  # its own transaction
            assert registry.shadow(conn, "tm") is not None
            conn.execute("DROP " + squat.split(" (")[0].split(" AS ")[0])
        finished = cli(*url, "reindex", "tm")
        assert finished.exit_code == 0, finished.output
        assert registry.get(conn, "tm").chunked
