"""`pgembed alter-table` while the application and the daemon work: a batch embedded before the
statement, rows changed or keys queued meanwhile, a vector written while it waits, a reader of
the chunks (the statement itself: test_alter_table.py)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from alter_helpers import synced, vectors
from pgvector import Vector

import pgembed
from daemon_helpers import assert_every_vector_matches_its_text, wait_until_blocked
from helpers import REVIEWS, cli
from pgembed import db
from pgembed.catalog import registry
from pgembed.lifecycle import altertable, models
from pgembed.sync import batch


def test_a_batch_embedded_before_the_statement_is_written_after_it(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    config = batch.BatchConfig(worker_id="w1", claim_size=100, lease_seconds=60, max_attempts=5)
    claimed = batch.fetch(reviews, spec, config)
    assert claimed is not None and len(claimed.rows) == 8
    embedded = batch.embed(claimed, config)
    alter = ("--database-url", db_url, "alter-table", "reviews")
    cut = "ALTER TABLE reviews ALTER COLUMN body TYPE varchar(40) USING left(body, 40)"
    assert cli(*alter, cut).exit_code == 0
    with db.connection(db_url) as daemon:  # the worker's own session, with the old catalog
        written = batch.write_back(daemon, claimed, embedded, config, 1.0)
    unchanged = sum(1 for _, text in REVIEWS if len(text) <= 40)
    assert written.written == unchanged  # the md5 guard skips the texts the statement cut
    # A new key type changes the write's casts: a batch in flight is given back, the catalog
    # read again.
    reviews.execute("UPDATE reviews SET body = 'Written after the key type changed.' WHERE id = 4")
    again = batch.fetch(reviews, spec, config)
    assert again is not None
    embedded = batch.embed(again, config)
    assert cli(*alter, "ALTER TABLE reviews ALTER COLUMN id TYPE bigint").exit_code == 0
    with db.connection(db_url) as daemon, pytest.raises(batch.ModelChanged):
        batch.write_back(daemon, again, embedded, config, 1.0)
    synced(db_url)
    assert_every_vector_matches_its_text(reviews)


def test_a_row_changed_while_the_fingerprints_are_taken_is_embedded_again(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    # The fingerprints are taken before the table's lock: an application's UPDATE that commits
    # after them (while alter-table waits for the lock) must still end with its text's vector.
    synced(db_url)
    alter_while_the_application_writes(
        db_url,
        "reviews",
        "ALTER TABLE reviews ALTER COLUMN body TYPE varchar(500)",
        "UPDATE reviews SET body = 'Changed while alter-table waited.' WHERE id = 6",
    )
    synced(db_url)
    assert_every_vector_matches_its_text(reviews)


def test_a_vector_the_daemon_writes_while_alter_table_waits_is_kept(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    """A write-back that commits while alter-table waits for the model's catalog row: the
    fingerprints were taken before, so its new vector read as the statement's change, and the
    row was cleared and queued again ("1 rows' text changed", an audit). The catalog rows are
    locked before the fingerprints now: the daemon's write lands before them, or waits."""
    synced(db_url)
    text = "Written back while alter-table waited for the catalog row."
    reviews.execute("INSERT INTO reviews (id, body) VALUES (100, %s)", (text,))
    with pgembed.Client(db_url) as client:
        vector = client.embed("minilm", [text])[0]
    with db.connection(db_url, autocommit=False) as daemon, ThreadPoolExecutor(1) as pool:
        daemon.execute("SELECT name FROM pgembed.models WHERE name = 'minilm' FOR SHARE")
        daemon.execute("SET LOCAL pgembed.writing = on")
        daemon.execute("UPDATE reviews SET embedding_minilm = %s WHERE id = 100", (Vector(vector),))
        with db.connection(db_url) as conn:
            conn.autocommit = True
            running = pool.submit(altertable.alter_table, conn, "reviews", "SELECT 1")
            wait_until_blocked(db_url, conn.info.backend_pid)
            daemon.commit()
            altered = running.result(timeout=60)
    assert altered.requeued == {"minilm": 0}
    row = reviews.execute("SELECT embedding_minilm IS NOT NULL FROM reviews WHERE id = 100")
    assert row.fetchone() == (True,)


def alter_while_the_application_writes(db_url: str, table: str, statement: str, write: str) -> None:
    """alter-table, with an application's `write` committed after its fingerprints: while it
    waits for the table's lock, which the writing transaction holds."""
    with db.connection(db_url, autocommit=False) as app, ThreadPoolExecutor(1) as pool:
        app.execute(write)
        with db.connection(db_url) as conn:
            conn.autocommit = True
            running = pool.submit(altertable.alter_table, conn, table, statement)
            wait_until_blocked(db_url, conn.info.backend_pid)
            app.commit()
            running.result(timeout=60)


def test_a_set_in_the_statement_does_not_change_how_keys_are_compared(
    reviews: psycopg.Connection, db_url: str
) -> None:
    reviews.execute("CREATE TABLE events (at timestamptz PRIMARY KEY, body text)")
    reviews.execute(
        "INSERT INTO events SELECT timestamptz '2026-01-01 00:00+00' + id * interval '1 h', body "
        "FROM reviews"
    )
    request = models.AddRequest("ev", "events", "body", key="at", precision="fp32")
    models.add(reviews, request)
    synced(db_url)
    result = cli(
        "--database-url",
        db_url,
        "alter-table",
        "events",
        "SET timezone = 'Asia/Kolkata'; SET datestyle = 'SQL, DMY'; "
        "ALTER TABLE events ALTER COLUMN body TYPE varchar(500)",
    )
    assert result.exit_code == 0, result.output
    assert "queued" not in result.output  # no key looks changed
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
    assert reviews.execute("SELECT count(*) FROM events WHERE embedding_ev IS NULL").fetchone() == (
        0,
    )


def test_a_key_queued_in_its_old_spelling_meanwhile_is_not_left_behind(
    reviews: psycopg.Connection, db_url: str
) -> None:
    # A row inserted after the fingerprints (while alter-table waits for the lock) is queued by
    # its trigger as 5001.00; once the key is bigint the daemon could not even read that key, and
    # every batch claimed with it failed. It is forgotten, and the row queued as 5001.
    reviews.execute("CREATE TABLE keyed (id numeric(14,2) PRIMARY KEY, body text)")
    reviews.execute("INSERT INTO keyed SELECT id, body FROM reviews")
    models.add(reviews, models.AddRequest("kt", "keyed", "body", precision="fp32"))
    synced(db_url)
    alter_while_the_application_writes(
        db_url,
        "keyed",
        "ALTER TABLE keyed ALTER COLUMN id TYPE bigint",
        "INSERT INTO keyed VALUES (5001, 'Inserted while alter-table waited.')",
    )
    pending = reviews.execute(
        "SELECT key FROM pgembed.queue UNION ALL SELECT key FROM pgembed.inbox"
    ).fetchall()
    # Every key is written otherwise now (1.00 is 1): matched by their text, all are queued
    # (docs/lifecycle.md), each once, in the new spelling.
    assert sorted(key for (key,) in pending) == sorted([str(k) for k, _ in REVIEWS] + ["5001"])
    synced(db_url)
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
    missing = reviews.execute("SELECT count(*) FROM keyed WHERE embedding_kt IS NULL").fetchone()
    assert missing == (0,)


def test_a_key_that_is_no_longer_unique_is_refused(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    result = cli(
        "--database-url",
        db_url,
        "alter-table",
        "reviews",
        "ALTER TABLE reviews DROP CONSTRAINT reviews_pkey",
    )
    assert result.exit_code != 0
    assert "key column 'id' of public.reviews is not unique" in result.output


def test_the_same_from_python_the_client_and_the_async_client(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    synced(db_url)
    before = vectors(reviews)
    done = pgembed.alter_table(
        "reviews", "ALTER TABLE reviews ALTER COLUMN id TYPE bigint", database_url=db_url
    )
    assert (done.models, done.key_types) == (["minilm"], {"minilm": ("integer", "bigint")})
    with pgembed.Client(db_url) as client:
        done = client.alter_table("reviews", "ALTER TABLE reviews ALTER COLUMN body TYPE varchar")
        assert done.requeued == {"minilm": 0}
        with pytest.raises(pgembed.UsageError, match="the statement failed, nothing changed"):
            client.alter_table("reviews", "ALTER TABLE reviews ALTER COLUMN nope TYPE text")

    async def from_asyncio() -> None:
        async with pgembed.AsyncClient(db_url) as client:
            done = await client.alter_table(
                "reviews", "ALTER TABLE reviews ALTER COLUMN body TYPE text"
            )
            assert done.requeued == {"minilm": 0}

    asyncio.run(from_asyncio())
    with pytest.raises(pgembed.UsageError, match="statement must be a string"):
        pgembed.alter_table("reviews", None, database_url=db_url)  # type: ignore[arg-type]
    assert vectors(reviews) == before
    assert [
        type_
        for (type_,) in reviews.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 'reviews'::regclass AND attname IN ('id', 'body') ORDER BY attnum"
        ).fetchall()
    ] == ["bigint", "text"]


def test_an_application_reading_the_chunks_then_the_table_is_not_failed(
    reviews: psycopg.Connection, db_url: str
) -> None:
    # alter-table holds the table and waits for the chunk table, which an application's
    # transaction has read; that transaction then reads the table. It must not fail, and
    # alter-table finishes once it ends. (Here alter-table waited first, so even without the
    # chunk locks' short wait the deadlock check would pick it; the short wait is for when the
    # application waited first, an order this test cannot set up.)
    models.add(
        reviews,
        models.AddRequest("minilm", "reviews", "body", long_texts="chunk", precision="fp32"),
    )
    with db.connection(db_url, autocommit=False) as app, ThreadPoolExecutor(1) as pool:
        app.execute("SELECT count(*) FROM pgembed_minilm_chunks")
        with db.connection(db_url) as conn:
            conn.autocommit = True
            running = pool.submit(altertable.alter_table, conn, "reviews", "SELECT 1")
            wait_until_blocked(db_url, conn.info.backend_pid)
            app.execute("SELECT count(*) FROM reviews")  # no error here
            app.commit()
            assert running.result(timeout=60).models == ["minilm"]
