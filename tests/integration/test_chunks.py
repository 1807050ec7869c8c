"""Long texts in chunks: `model add --long-texts chunk` embeds every window of a long review, and
every search ranks a row by its best window.

Real data: 12 IMDB reviews of 600+ word pieces and 40 shorter ones (tests/data), two models on
the same table: `whole` (chunk) and `first` (truncate, the default). The recall test at the end
has its own table: 240 reviews of 2-3 windows, judged against exact search by best window.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pgvector import Vector as PgVector
from pgvector.sqlalchemy import Vector
from psycopg import sql
from psycopg.types.json import Jsonb
from roles_helpers import role_maker
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import pgembed
from helpers import cli, database, database_name, plans, writing_vectors
from pgembed import db
from pgembed.catalog import registry
from pgembed.contrib import sqlalchemy as orm
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.errors import UsageError
from pgembed.lifecycle import models, status, switch
from pgembed.search import topk
from pgembed.sync import worker

DATA = Path(__file__).parent.parent / "data"


def _read(name: str) -> list[dict[str, str]]:
    with (DATA / name).open(newline="") as file:
        return list(csv.DictReader(file))


LONG, SHORT = _read("imdb-long-reviews.csv"), _read("imdb-reviews-excerpt.csv")


@pytest.fixture(scope="module")
def long_template(server_url: str, template_url: str) -> Iterator[str]:
    with database(server_url, "pgembed_test_long", template=database_name(template_url)) as url:
        with db.connection(url) as conn:
            conn.execute(
                "CREATE TABLE long_reviews (id integer PRIMARY KEY, rating integer, text text)"
            )
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO long_reviews VALUES (%s, %s, %s)",
                    [(int(r["id"]), int(r["rating"]), r["text"]) for r in LONG + SHORT],
                )
            for name, long_texts in (("whole", "chunk"), ("first", "truncate")):
                request = models.AddRequest(
                    name, "long_reviews", "text", precision="fp32", long_texts=long_texts,
                    fulltext=True,
                )  # fmt: skip
                models.add(conn, request)
        worker.Worker(url, worker.Options(once=True)).run()
        with db.connection(url) as conn:
            # Counted now, as autovacuum would count them at a time of its own: the tables' size
            # decides a search's path (52 rows and their chunks are read exactly).
            conn.execute("ANALYZE long_reviews")
            conn.execute("ANALYZE pgembed_whole_chunks")
        yield database_name(url)


@pytest.fixture
def url(server_url: str, long_template: str) -> Iterator[str]:
    with database(server_url, "l", template=long_template) as copy:
        yield copy


@pytest.fixture
def conn(url: str) -> Iterator[psycopg.Connection]:
    with db.connection(url) as connection:
        yield connection


def tail_sentence(text: str) -> str:
    """A sentence (10+ words) from past the review's first 300 word pieces: text the first
    window (254 word pieces) cannot have seen."""
    spec = embedder.Settings(model_ref="all-MiniLM-L6-v2", pooling="mean", precision="fp32")
    (found,) = embedder.get(spec).chunk_windows([text], overlap=0, max_windows=2)
    rest = text[found.spans[0][0] + 200 :]
    return next(s for s in re.split(r"(?<=[.!?])\s+", rest)[1:] if len(s.split()) >= 10)


def chunk_count(conn: psycopg.Connection, key: int | None = None) -> int:
    query = "SELECT count(*) FROM pgembed_whole_chunks"
    row = conn.execute(
        query + (" WHERE key = %s" if key is not None else ""), (key,) if key else ()
    )
    return int(row.fetchone()[0])  # type: ignore[index]


def test_windows_are_stored_beside_the_table_and_counted(conn: psycopg.Connection) -> None:
    spec = registry.get(conn, "whole")
    texts = {int(r["id"]): r["text"] for r in LONG + SHORT}
    windows = embedder.get(settings_of(spec)).chunk_windows(list(texts.values()), 32, 64)
    expected = {key: len(w.spans) for key, w in zip(texts, windows, strict=True) if w.spans}
    stored: dict[int, int] = dict(
        conn.execute("SELECT key, count(*) FROM pgembed_whole_chunks GROUP BY key").fetchall()
    )
    assert stored == expected
    assert set(stored) == {int(r["id"]) for r in LONG}  # the short reviews fit one window
    assert conn.execute(
        "SELECT min(chunk), bool_and(embedding IS NOT NULL) FROM pgembed_whole_chunks"
    ).fetchone() == (1, True)
    report = {m["name"]: m for m in status.all_status(conn)}
    assert (report["whole"]["chunks"], report["whole"]["rows_embedded"]) == (
        sum(expected.values()),
        52,
    )
    assert report["whole"]["truncated"] == 0  # every window was embedded
    assert report["first"]["truncated"] == 12 and report["first"]["chunks"] == 0


def test_a_row_is_found_by_text_past_its_first_window(conn: psycopg.Connection, url: str) -> None:
    """Known-item queries from the part of each long review the first window cannot see."""
    queries = {int(r["id"]): tail_sentence(r["text"]) for r in LONG}
    found = {"whole": 0, "first": 0}
    with pgembed.Client(url) as client:
        for key, query in queries.items():
            for model in found:
                found[model] += key in [hit.key for hit in client.search(model, query, k=3)]
    # Measured: 10 of 12 with chunks, 6 of 12 from the first window only.
    assert found["whole"] >= 10
    assert found["first"] <= 7


def test_every_search_path_ranks_rows_by_their_best_window(
    conn: psycopg.Connection, url: str
) -> None:
    review = LONG[7]  # id 124: its tail sentence is found top-1 with chunks
    key, query = int(review["id"]), tail_sentence(review["text"])
    with pgembed.Client(url) as client:
        hits = client.search("whole", query, k=5)
        vector = client.embed("whole", [query], queries=True)[0]
        hybrid = client.hybrid_search("whole", query, k=5)
        filtered = client.search("whole", query, k=5, filter={"rating": {"$gte": 1}})
    assert hits[0].key == key and hits[0].text == review["text"]
    assert [h.key for h in filtered] == [h.key for h in hits]
    assert key in [h.key for h in hybrid]
    # The SQL helper: the same rows, from both tables (main column and chunks), read exactly as
    # the tables are small (long_template); the indexes' path is the big table's test below.
    with plans(conn) as found:
        rows = conn.execute(
            "SELECT key, similarity FROM pgembed.search('whole', %s, 5, '{}')", (PgVector(vector),)
        ).fetchall()
    assert [int(k) for k, _ in rows] == [h.key for h in hits]
    assert [s for _, s in rows] == pytest.approx([h.similarity for h in hits], abs=1e-6)
    joined = "\n".join(found)
    assert "pgembed_whole_hnsw" not in joined and "on pgembed_whole_chunks" in joined
    # The CLI, and the ORM.
    result = cli("--database-url", url, "query", "--model", "whole", query, "-k", "1")
    assert result.exit_code == 0 and result.output.startswith(f"{key}\t"), result.output
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with Session(engine) as session:
        orm_hits = orm.nearest(session, LongReview, "whole", query, k=5)
    engine.dispose()
    assert [r.id for r, _ in orm_hits] == [h.key for h in hits]
    assert [s for _, s in orm_hits] == pytest.approx([h.similarity for h in hits], abs=1e-5)


class Base(DeclarativeBase):
    pass


class LongReview(Base):
    __tablename__ = "long_reviews"
    id: Mapped[int] = mapped_column(primary_key=True)
    rating: Mapped[int]
    text: Mapped[str]
    embedding_whole: Mapped[object] = mapped_column(Vector(384), deferred=True)


def test_filters_still_return_k_rows(conn: psycopg.Connection, url: str) -> None:
    """A filter that keeps few rows: iterative scans of both indexes still find k of them."""
    with pgembed.Client(url) as client:
        hits = client.search("whole", "a slow, beautiful film", k=4, filter={"rating": 10})
    tens = {int(r["id"]) for r in LONG + SHORT if r["rating"] == "10"}
    assert len(hits) == 4 and {h.key for h in hits} <= tens


def test_chunks_follow_their_row(conn: psycopg.Connection, url: str) -> None:
    """Update, key change, delete and truncate clean the chunks up in the application's own
    statement; the daemon writes a changed row's new windows."""
    first, second, third = (int(r["id"]) for r in LONG[:3])
    before = chunk_count(conn, first)
    conn.execute("UPDATE long_reviews SET rating = 1 WHERE id = %s", (first,))  # not its text
    assert chunk_count(conn, first) == before
    conn.execute("UPDATE long_reviews SET text = 'Short now.' WHERE id = %s", (first,))
    assert chunk_count(conn, first) == 0
    conn.execute("UPDATE long_reviews SET id = 99999 WHERE id = %s", (second,))
    assert chunk_count(conn, second) == 0
    queued = conn.execute("SELECT key FROM pgembed.queue WHERE model = 'whole' ORDER BY key")
    assert [k for (k,) in queued] == [str(first), "99999"]  # re-embedded under its new key
    conn.execute("DELETE FROM long_reviews WHERE id = %s", (third,))
    assert chunk_count(conn, third) == 0
    assert pgembed.sync_once(database_url=url, models=["whole"]).written == 2
    assert chunk_count(conn, first) == 0 and chunk_count(conn, 99999) > 0
    conn.execute("TRUNCATE long_reviews")
    assert chunk_count(conn) == 0


def test_a_changed_row_is_not_found_by_its_old_windows(conn: psycopg.Connection, url: str) -> None:
    review = LONG[7]
    key, query = int(review["id"]), tail_sentence(review["text"])
    conn.execute("UPDATE long_reviews SET text = 'Nothing like it.' WHERE id = %s", (key,))
    with pgembed.Client(url) as client:
        assert key not in [h.key for h in client.search("whole", query, k=10)]


def test_reindex_into_chunks_and_remove(conn: psycopg.Connection, url: str) -> None:
    result = cli("--database-url", url, "model", "alter", "first", "--long-texts", "chunk")
    assert result.exit_code == 0, result.output
    spec = registry.get(conn, "first")
    assert spec.chunked and spec.version == 2
    counts = conn.execute(
        "SELECT (SELECT count(*) FROM pgembed_first_chunks), "
        "(SELECT count(*) FROM pgembed_whole_chunks)"
    ).fetchone()
    assert counts is not None and counts[0] == counts[1] > 0
    assert conn.execute("SELECT to_regclass('pgembed_first__next_chunks')").fetchone() == (None,)
    # A chunked model reindexed: the new version's chunks replace the old ones.
    result = cli("--database-url", url, "reindex", "whole")
    assert result.exit_code == 0, result.output
    assert chunk_count(conn) == counts[1]
    with pgembed.Client(url) as client:
        query = tail_sentence(LONG[7]["text"])
        assert client.search("first", query, k=1)[0].key == int(LONG[7]["id"])
    result = cli("--database-url", url, "model", "remove", "first")
    assert result.exit_code == 0, result.output
    assert conn.execute("SELECT to_regclass('pgembed_first_chunks')").fetchone() == (None,)


def test_a_new_owner_of_schema_pgembed_keeps_its_chunk_tables(
    conn: psycopg.Connection, url: str
) -> None:
    """`ALTER SCHEMA pgembed OWNER TO` moves neither pgembed's catalog nor its functions: chunk
    tables, old and new, stay with the catalog's owner (whom the capture functions run as), so
    searches read them, handing the schema back breaks nothing and `model remove` drops them. A
    chunk table handed to another role is not pgembed's: remove stops with one line that says
    what holds the vector column."""
    owner = conn.execute("SELECT current_user").fetchone()
    query = tail_sentence(LONG[7]["text"])
    with role_maker(url) as make:
        heir, stranger = make("heir"), make("stranger")
        conn.execute(sql.SQL("ALTER SCHEMA pgembed OWNER TO {}").format(sql.Identifier(heir)))
        with pgembed.Client(url) as client:
            assert client.search("whole", query, k=1)[0].key == int(LONG[7]["id"])
        result = cli("--database-url", url, "model", "alter", "first", "--long-texts", "chunk")
        assert result.exit_code == 0, result.output
        made = "SELECT relowner::regrole::text FROM pg_class WHERE relname = 'pgembed_first_chunks'"
        assert conn.execute(made).fetchone() == owner  # not the heir's
        conn.execute("ALTER SCHEMA pgembed OWNER TO CURRENT_USER")  # handed back
        with pgembed.Client(url) as client:
            assert client.search("first", query, k=1)[0].key == int(LONG[7]["id"])
        conn.execute(
            sql.SQL("ALTER TABLE pgembed_first_chunks OWNER TO {}").format(sql.Identifier(stranger))
        )
        result = cli("--database-url", url, "model", "remove", "first")
        assert result.exit_code == 1, result.output
        assert "depends on column embedding_first" in result.output, result.output
        assert conn.execute("SELECT count(*) FROM pgembed.models").fetchone() == (2,)
        result = cli("--database-url", url, "model", "remove", "whole")
        assert result.exit_code == 0, result.output
        assert conn.execute("SELECT to_regclass('pgembed_whole_chunks')").fetchone() == (None,)


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

        copy = "COPY items (id, body, bucket, embedding_big) FROM STDIN (FORMAT BINARY)"
        with writing_vectors(conn), conn.cursor() as cur, cur.copy(copy) as out:
            out.set_types(["integer", "text", "text", "vector"])
            for i, vector in enumerate(unit(3000)):
                out.write_row(
                    (i, f"item {i}", "rare" if i % 50 == 0 else "common", PgVector(vector))
                )
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
        copy = "COPY items (id, body, embedding_shallow) FROM STDIN (FORMAT BINARY)"
        with writing_vectors(conn), conn.cursor() as cur, cur.copy(copy) as out:
            out.set_types(["integer", "text", "vector"])
            for i, vector in enumerate(vectors):
                out.write_row((i, f"item {i}", PgVector(vector)))
        copy = "COPY pgembed_shallow_chunks (key, chunk, embedding) FROM STDIN (FORMAT BINARY)"
        with conn.cursor() as cur, cur.copy(copy) as out:
            out.set_types(["integer", "integer", "vector"])
            for i, vector in enumerate(vectors):  # a window much like the first
                chunk = vector + 0.2 * rng.normal(size=spec.dimensions) / spec.dimensions**0.5
                out.write_row((i, 1, PgVector((chunk / np.linalg.norm(chunk)).astype(np.float32))))
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


# --- recall against exact search, by best window ------------------------------------------------
#
# 240 real reviews of 2-3 windows (tests/data/imdb-chunk-reviews.csv), embedded by the real model
# through `pgembed sync`; the 40 short reviews of imdb-reviews-excerpt.csv as held-out queries.
# At 240 rows (and 286 chunks: 194 rows of two windows, 46 of three) a search without a filter
# walks both HNSW indexes (exact below 200 rows, pgembed._exact_v1); one with a filter reads the
# matching rows exactly unless `SET pgembed.exact_rows = 0` makes it walk them too (with
# sequential scans off, as the planner would rather read 240 rows whole).
# Measured: recall@10 1.0 on every path here; ranking the rows by their first window alone (as a
# search that missed the chunks would) finds 0.59 of the exact top 10.

CHUNKED = _read("imdb-chunk-reviews.csv")
K = 10
RECALL_FILTERS: dict[str, tuple[dict[str, object] | None, set[int]]] = {
    "no filter": (None, {int(r["id"]) for r in CHUNKED}),
    "rating >= 8 (40 %)": (
        {"rating": {"$gte": 8}},
        {int(r["id"]) for r in CHUNKED if int(r["rating"]) >= 8},
    ),
    "rating = 9 (8 %)": ({"rating": 9}, {int(r["id"]) for r in CHUNKED if r["rating"] == "9"}),
}


@pytest.fixture(scope="module")
def chunked_url(server_url: str, template_url: str) -> Iterator[str]:
    with database(server_url, "pgembed_test_chunked", template=database_name(template_url)) as url:
        with db.connection(url) as conn:
            conn.execute("CREATE TABLE films (id integer PRIMARY KEY, rating integer, text text)")
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO films VALUES (%s, %s, %s)",
                    [(int(r["id"]), int(r["rating"]), r["text"]) for r in CHUNKED],
                )
            request = models.AddRequest(
                "films", "films", "text", precision="fp32", long_texts="chunk"
            )
            models.add(conn, request)
        worker.Worker(url, worker.Options(once=True)).run()
        with db.connection(url) as conn:
            conn.execute("ANALYZE films")
            conn.execute("ANALYZE pgembed_films_chunks")
        yield url


@pytest.fixture(scope="module")
def windows(chunked_url: str) -> tuple[np.ndarray, np.ndarray]:
    """Every window's vector (a row's own, its first window, and its chunks, the windows past
    the first) with its row's key."""
    with db.connection(chunked_url) as conn:
        rows = conn.execute(
            "SELECT id, embedding_films FROM films WHERE embedding_films IS NOT NULL "
            "UNION ALL SELECT key, embedding FROM pgembed_films_chunks"
        ).fetchall()
    keys = np.array([key for key, _ in rows])
    vectors = np.array([v.to_numpy() for _, v in rows])
    return keys, vectors.astype(np.float64)


@pytest.fixture(scope="module")
def held_out(chunked_url: str) -> np.ndarray:
    with pgembed.Client(chunked_url) as client:
        return np.asarray(client.embed("films", [r["text"] for r in SHORT], queries=True))


def best_windows(
    windows: tuple[np.ndarray, np.ndarray], query: np.ndarray, rows: set[int]
) -> dict[int, float]:
    """Each of `rows`' distance to the query by its nearest window, from every window's vector."""
    keys, vectors = windows
    distances = 1 - vectors @ (query / np.linalg.norm(query))
    best: dict[int, float] = {}
    for key, distance in zip(keys.tolist(), distances.tolist(), strict=True):
        if key in rows and distance < best.get(key, np.inf):
            best[key] = distance
    return best


@pytest.mark.parametrize("walk", ["default", "index walk"])
@pytest.mark.parametrize("label", RECALL_FILTERS)
def test_a_chunked_models_search_finds_the_exact_rows_best_first(
    chunked_url: str,
    windows: tuple[np.ndarray, np.ndarray],
    held_out: np.ndarray,
    label: str,
    walk: str,
) -> None:
    """pgembed.search against the exact ranking (every window's distance, a row's best, the
    top 10): recall@10 >= 0.95, best first, each row scored by its best window."""
    filter, rows = RECALL_FILTERS[label]
    with db.connection(chunked_url) as conn:
        if walk == "index walk":
            # Not the filtered rows read exactly, and (240 rows: the planner would rather read
            # them all) the HNSW indexes, not a scan, under the filter too.
            conn.execute("SET pgembed.exact_rows = 0")
            conn.execute("SET enable_seqscan = off")
        recalls = []
        with plans(conn) as found:
            for query in held_out:
                truth = best_windows(windows, query, rows)
                best = sorted(truth, key=lambda key: (truth[key], key))[:K]
                hits = conn.execute(
                    "SELECT key::integer, similarity FROM pgembed.search('films', %s, %s, %s)",
                    (PgVector(query), K, None if filter is None else Jsonb(filter)),
                ).fetchall()
                similarities = [similarity for _, similarity in hits]
                assert len(hits) == min(K, len(rows))
                assert similarities == sorted(similarities, reverse=True)
                assert similarities == pytest.approx([1 - truth[key] for key, _ in hits], abs=1e-5)
                recalls.append(len({key for key, _ in hits} & set(best)) / len(best))
    assert np.mean(recalls) >= 0.95, recalls
    # The path the test means: the rows' HNSW index walked unless a filter's rows are read
    # exactly; without a filter, the chunks' index too. (Under a filter the planner may read the
    # matching rows' chunks by their key rather than walk the chunks' index: its choice.)
    joined = "\n".join(found)
    assert ("pgembed_films_hnsw " in joined) == (walk == "index walk" or filter is None)
    assert ("pgembed_films_hnswc" in joined) >= (filter is None)


def _fused(semantic: list[str], lexical: list[str], k: int) -> list[tuple[str, float]]:
    """Reciprocal-rank fusion (constant 60) as hybrid_search orders it: by score, then by the
    vector ranking, then by the full-text ranking."""
    ranks = [{key: rank for rank, key in enumerate(r, start=1)} for r in (semantic, lexical)]
    keys = {*semantic, *lexical}
    scores = {key: sum(1 / (60 + r[key]) for r in ranks if key in r) for key in keys}
    order = sorted(scores, key=lambda key: (-scores[key], *(r.get(key, 10**9) for r in ranks)))
    return [(key, scores[key]) for key in order[:k]]


def test_a_hybrid_query_most_rows_match_ranks_its_words_among_the_vector_ranking(
    server_url: str, chunked_url: str, held_out: np.ndarray
) -> None:
    """A full-text query that matches more than pgembed.fulltext_rows rows (a word most rows
    have) is ranked by its words among the vector ranking's rows only: ranking every match read
    each one's text (`film`: 5.4 s on 50,000 IMDb reviews). A rarer query is ranked over every
    row it matches, as before. On 240 real reviews, 167 of which say `film` and 4 `zombie`, with
    the cutoff at 100; `model fulltext` takes the statistics the estimate reads."""
    with database(server_url, "hybrid_common", template=database_name(chunked_url)) as url:
        assert cli("--database-url", url, "model", "fulltext", "films").exit_code == 0
        with db.connection(url) as conn:
            vector = PgVector(held_out[0])
            semantic = [
                key
                for (key,) in conn.execute(
                    "SELECT key FROM pgembed.search('films', %s, 40)", (vector,)
                ).fetchall()
            ]

            def lexical(text: str, among: list[str] | None) -> list[str]:
                return [
                    key
                    for (key,) in conn.execute(
                        "SELECT f.id::text FROM films f, websearch_to_tsquery('english', %s) q "
                        "WHERE to_tsvector('english', f.text) @@ q "
                        "AND (%s::text[] IS NULL OR f.id::text = ANY(%s::text[])) "
                        "ORDER BY ts_rank_cd(to_tsvector('english', f.text), q) DESC, f.id "
                        "LIMIT 40",  # f.id: the key's order, not its text's (ties are common)
                        (text, among, among),
                    ).fetchall()
                ]

            def hybrid(text: str) -> list[tuple[str, float]]:
                return conn.execute(
                    "SELECT key, score FROM pgembed.hybrid_search('films', %s, %s, 10)",
                    (vector, text),
                ).fetchall()

            full = _fused(semantic, lexical("film", None), 10)
            among = _fused(semantic, lexical("film", semantic), 10)
            assert [key for key, _ in full] != [key for key, _ in among]  # the test tells them
            got = hybrid("film")  # 167 rows < 5,000, the default cutoff: every match ranked
            assert [key for key, _ in got] == [key for key, _ in full]
            conn.execute("SET pgembed.fulltext_rows = 100")
            got = hybrid("film")
            assert [key for key, _ in got] == [key for key, _ in among]
            assert [score for _, score in got] == pytest.approx([score for _, score in among])
            assert {key for key, _ in got} <= set(semantic)
            rare = _fused(semantic, lexical("zombie", None), 10)
            assert not {key for key, _ in rare} <= set(semantic)  # a review the vectors missed
            assert [key for key, _ in hybrid("zombie")] == [key for key, _ in rare]
            # An estimate past the cutoff is counted before it is believed: here statistics that
            # still see `film` in 167 rows after all but the 3 farthest went (the statistics'
            # guess for a word they do not list, at most 0.5 % of the rows, is 5,000 at 1M rows).
            conn.execute("ALTER TABLE films SET (autovacuum_enabled = false)")
            everything = conn.execute(
                "SELECT key FROM pgembed.search('films', %s, 240)", (vector,)
            ).fetchall()
            film = {
                key
                for (key,) in conn.execute(
                    "SELECT id::text FROM films "
                    "WHERE to_tsvector('english', text) @@ websearch_to_tsquery('english', 'film')"
                ).fetchall()
            }
            assert len(film) == 167
            kept = [key for (key,) in everything if key in film][-3:]
            conn.execute(
                "DELETE FROM films WHERE id::text = ANY(%s)", ([k for k in film if k not in kept],)
            )
            (plan,) = conn.execute(
                "EXPLAIN (FORMAT JSON) SELECT FROM films t "
                "WHERE to_tsvector('english', t.text) @@ websearch_to_tsquery('english', 'film')"
            ).fetchone() or ([],)
            assert plan[0]["Plan"]["Plan Rows"] > 100  # the estimate alone: common
            semantic = [
                key
                for (key,) in conn.execute(
                    "SELECT key FROM pgembed.search('films', %s, 40)", (vector,)
                ).fetchall()
            ]
            few = _fused(semantic, lexical("film", None), 10)
            assert not set(kept) <= set(semantic)
            assert [key for key, _ in hybrid("film")] == [key for key, _ in few]
