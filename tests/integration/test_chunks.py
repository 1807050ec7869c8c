"""Long texts in chunks: `model add --long-texts chunk` embeds every window of a long review, and
every search ranks a row by its best window.

Real data: 12 IMDB reviews of 600+ word pieces and 40 shorter ones (tests/data), two models on
the same table: `whole` (chunk) and `first` (truncate, the default). Chunked tables of a test's own
(random vectors, names taken): test_chunk_tables.py; recall against exact search by best window:
test_chunk_recall.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest
from imdb_reviews import LONG, SHORT
from pgvector import Vector as PgVector
from pgvector.sqlalchemy import Vector
from psycopg import sql
from roles_helpers import role_maker
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import pgembed
from helpers import cli, database, database_name, plans
from pgembed import db
from pgembed.catalog import registry
from pgembed.contrib import sqlalchemy as orm
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.lifecycle import models, status
from pgembed.sync import worker


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
