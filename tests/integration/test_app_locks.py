"""The daemon's write-back beside an application's transactions that hold row locks: the daemon
never waits for a row the application holds, so the two never deadlock, and no row is lost."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from daemon_helpers import assert_every_vector_matches_its_text, wait_for, waiting_for_a_lock
from helpers import REVIEWS, cli, make_due, run_batch
from pgembed import db
from pgembed.catalog import registry
from pgembed.lifecycle import models
from pgembed.sync import batch, leases, store, worker

CONFIG = batch.BatchConfig(worker_id="w1", claim_size=100, lease_seconds=60, max_attempts=5)

# What the application's open transaction did to row 5 before the daemon's write-back, and what
# row 5 holds once it commits (None: deleted).
HOLDS = {
    "locks it": ("SELECT 1 FROM reviews WHERE id = 5 FOR UPDATE", True),
    "changes another column": ("UPDATE reviews SET stars = 1 WHERE id = 5", True),
    "changes its text": ("UPDATE reviews SET body = 'A new text meanwhile.' WHERE id = 5", True),
    "deletes it": ("DELETE FROM reviews WHERE id = 5", False),
}


@pytest.mark.parametrize("hold", HOLDS)
def test_a_write_back_never_waits_for_a_row_the_application_holds(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str, hold: str
) -> None:
    statement, kept = HOLDS[hold]
    claimed = batch.fetch(reviews, spec, CONFIG)
    assert claimed is not None and len(claimed.rows) == 8
    embedded = batch.embed(claimed, CONFIG)
    with db.connection(db_url, autocommit=False) as app, ThreadPoolExecutor(1) as pool:
        app.execute(statement)
        writing = pool.submit(batch.write_back, reviews, claimed, embedded, CONFIG, 1.0)
        with db.connection(db_url) as watcher:
            # The earlier write-back locked rows 1-4, then waited for row 5 (deadlocking).
            wait_for(
                lambda: writing.done() or waiting_for_a_lock(watcher, reviews.info.backend_pid),
                30,
                "the write-back to end or to wait",
            )
        # The application goes on to a row the daemon writes: with a daemon waiting for row 5,
        # one of the two transactions ended in `deadlock detected`.
        app.execute("UPDATE reviews SET stars = 2 WHERE id = 2")
        app.commit()
        result = writing.result(timeout=30)
    assert result.written == 7
    # Row 5's key is given back, not lost: the next pass writes what it holds now.
    make_due(reviews)  # the postponed key's pause over
    worker.Worker(db_url, worker.Options(once=True)).run()
    assert_every_vector_matches_its_text(reviews)
    left = reviews.execute("SELECT count(*) FROM reviews WHERE id = 5").fetchone()
    assert left == ((1,) if kept else (0,))
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)


def test_a_row_deleted_since_the_read_is_not_counted_as_held(
    spec: registry.ModelSpec,
    reviews: psycopg.Connection,
    db_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The write-back's SKIP LOCKED passes over a row that is gone as over a held one: the batch's
    # log line counted it in held=, which says how many rows applications kept the daemon from.
    claimed = batch.fetch(reviews, spec, CONFIG)
    assert claimed is not None and len(claimed.rows) == 8
    embedded = batch.embed(claimed, CONFIG)
    with db.connection(db_url) as app:
        app.execute("DELETE FROM reviews WHERE id = 5")
        with db.connection(db_url, autocommit=False) as holder:
            holder.execute("SELECT 1 FROM reviews WHERE id = 6 FOR UPDATE")
            with caplog.at_level(logging.INFO, logger="pgembed.sync"):
                result = batch.write_back(reviews, claimed, embedded, CONFIG, 1.0)
    assert (result.written, result.postponed, result.skipped) == (6, 1, 1)
    assert "rows=8 written=6 failed=0 held=1 reused=0 " in caplog.text
    make_due(reviews)  # the postponed key's pause over
    worker.Worker(db_url, worker.Options(once=True)).run()
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
    assert_every_vector_matches_its_text(reviews)


@pytest.mark.parametrize(
    ("statement", "reused"),
    [
        ("UPDATE reviews SET stars = 1 WHERE id = 5", 1),
        ("UPDATE reviews SET body = 'A new text meanwhile.' WHERE id = 5", 0),
    ],
    ids=["same text", "new text"],
)
def test_a_held_row_is_not_embedded_again_while_its_text_is_the_same(
    spec: registry.ModelSpec,
    reviews: psycopg.Connection,
    db_url: str,
    caplog: pytest.LogCaptureFixture,
    statement: str,
    reused: int,
) -> None:
    daemon = worker.Worker(db_url, worker.Options(once=True))
    with db.connection(db_url, autocommit=False) as app:
        app.execute(statement)
        daemon.run()
        app.commit()
    assert reviews.execute("SELECT count(embedding_minilm) FROM reviews").fetchone() == (7,)
    make_due(reviews)  # the postponed key's pause over
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pgembed.sync"):
        daemon.run()  # the same worker's next pass, as a daemon's
    # The vector cached at the first try is written, unless the text is another now.
    assert f"rows=1 written=1 failed=0 held=0 reused={reused} " in caplog.text
    assert_every_vector_matches_its_text(reviews)
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)


def test_a_row_a_referencing_insert_holds_is_written_at_once(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    # An open transaction that inserts a row referencing review 5 holds it FOR KEY SHARE, which
    # the vector's UPDATE does not conflict with: it is written, not skipped and claimed again.
    reviews.execute("CREATE TABLE votes (review integer NOT NULL REFERENCES reviews (id))")
    claimed = batch.fetch(reviews, spec, CONFIG)
    assert claimed is not None and len(claimed.rows) == 8
    embedded = batch.embed(claimed, CONFIG)
    with db.connection(db_url, autocommit=False) as app:
        app.execute("INSERT INTO votes VALUES (5)")
        result = batch.write_back(reviews, claimed, embedded, CONFIG, 1.0)
        app.commit()
    assert result.written == 8 and result.postponed == 0
    assert_every_vector_matches_its_text(reviews)
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)


def test_a_write_back_that_waits_for_any_other_lock_gives_its_batch_back_soon(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    config = batch.BatchConfig(worker_id="w1", claim_size=100, lease_seconds=2, max_attempts=5)
    claimed = batch.fetch(reviews, spec, config)
    assert claimed is not None
    embedded = batch.embed(claimed, config)
    with db.connection(db_url, autocommit=False) as app:
        # A lock the daemon cannot step around: row 3's queue entry (as a capture trigger of
        # the application's holds it while it queues the key anew).
        app.execute("SELECT 1 FROM pgembed.queue WHERE key = '3' FOR UPDATE")
        started = time.monotonic()
        result = batch.write_back(reviews, claimed, embedded, config, 1.0)
        waited = time.monotonic() - started
        app.execute("UPDATE reviews SET stars = 2 WHERE id = 2")  # one the daemon had locked
        app.commit()
    # Row 3's entry is the application's to requeue (as an UPDATE's trigger would), so it is
    # not postponed, as a row whose text changed is skipped; the others are.
    assert (result.written, result.postponed, result.skipped) == (0, 7, 1)
    assert waited < 5, f"the write-back waited {waited:.1f} s"
    assert reviews.execute("SELECT count(embedding_minilm) FROM reviews").fetchone() == (0,)
    # Row 3's entry, held at the give-back, keeps its lease: ready only once the lease is over.
    leased = "SELECT count(*) FROM pgembed.queue WHERE key = '3' AND next_attempt_at > now()"
    assert reviews.execute(leased).fetchone() == (1,)
    make_due(reviews)
    worker.Worker(db_url, worker.Options(once=True)).run()
    assert_every_vector_matches_its_text(reviews)
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)


def test_sync_once_says_which_rows_another_transaction_held(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    with db.connection(db_url, autocommit=False) as app:
        app.execute("UPDATE reviews SET stars = 1 WHERE id = 5")
        result = cli("--database-url", db_url, "sync", "--once")
        app.commit()
    assert result.exit_code == 0, result.output
    assert "synced: 7 written, 0 skipped, 0 failed" in result.output
    assert (
        "1 rows were locked by another transaction when their vectors were written: "
        "`pgembed sync --once` again when it has ended"
    ) in result.output
    assert "(they are ready again in " in result.output
    make_due(reviews)  # the postponed key's pause over
    again = cli("--database-url", db_url, "sync", "--once")
    assert "synced: 1 written" in again.output, again.output
    assert_every_vector_matches_its_text(reviews)


def test_a_row_held_for_long_waits_longer_each_time(
    spec: registry.ModelSpec, reviews: psycopg.Connection
) -> None:
    """The pause is half the time the key has been queued, from 1 s to a minute: a row an
    application holds for long is not embedded again at every pass."""
    claims = store.claim(reviews, "minilm", "w1", 10, 60)
    ages = {"1": 0, "2": 30, "3": 600}  # seconds each key has been queued
    for key, age in ages.items():
        reviews.execute(
            "UPDATE pgembed.queue SET enqueued_at = now() - make_interval(secs => %s) "
            "WHERE key = %s",
            (age, key),
        )
    held = [c for c in claims if c.key in ages]
    assert store.postpone(reviews, "minilm", held, 1.0, 60.0) == 3
    pauses: dict[str, float] = dict(
        reviews.execute(
            "SELECT key, extract(epoch FROM next_attempt_at - now())::float FROM pgembed.queue "
            "WHERE key = ANY(%s) AND claimed_by IS NULL",
            (list(ages),),
        ).fetchall()
    )
    assert pauses == pytest.approx({"1": 1.0, "2": 15.0, "3": 60.0}, abs=0.5)


def test_a_renewal_in_flight_does_not_make_a_held_row_wait_for_its_lease(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    """The lease renewer's renewal locks the worker's queue entries for a moment; a postpone at that
    moment skipped them as if the application held them, and the key waited out its lease."""
    claimed = batch.fetch(reviews, spec, CONFIG)
    assert claimed is not None and len(claimed.rows) == 8
    embedded = batch.embed(claimed, CONFIG)
    leased = leases.Leases()
    renewal_began = threading.Event()

    def renew_slowly() -> None:  # as LeaseRenewer._tick's renewal, its statement slowed down
        with leased.renewing(), db.connection(db_url, autocommit=False) as renewer:
            renewer.execute("SELECT 1 FROM pgembed.queue WHERE key = '5' FOR UPDATE")
            renewal_began.set()
            time.sleep(0.5)
            renewer.commit()

    with db.connection(db_url, autocommit=False) as app, ThreadPoolExecutor(1) as pool:
        app.execute("SELECT 1 FROM reviews WHERE id = 5 FOR UPDATE")
        renewal = pool.submit(renew_slowly)
        assert renewal_began.wait(30)
        result = batch.write_back(reviews, claimed, embedded, CONFIG, 1.0, leased)
        app.commit()
        renewal.result(timeout=30)
    assert (result.written, result.postponed) == (7, 1)
    pause = reviews.execute(
        "SELECT extract(epoch FROM next_attempt_at - now())::float FROM pgembed.queue "
        "WHERE key = '5' AND claimed_by IS NULL"
    ).fetchone()
    assert pause is not None and pause[0] < 2 * batch.BUSY_ROW_PAUSE_SECONDS


def sixty_four_reviews(conn: psycopg.Connection) -> registry.ModelSpec:
    """64 reviews queued for model `minilm`: one batch, written in two slices or more."""
    conn.execute("CREATE TABLE reviews (id integer PRIMARY KEY, body text)")
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO reviews VALUES (%s, %s)",
            [(i, f"{REVIEWS[i % len(REVIEWS)][1]} (copy {i})") for i in range(1, 65)],
        )
    return models.add(conn, models.AddRequest("minilm", "reviews", "body", precision="fp32"))[0]


def test_a_batch_is_written_in_slices_that_commit_on_their_own(
    conn: psycopg.Connection, db_url: str
) -> None:
    """A write-back holds its rows until it commits, while pgvector inserts each vector into the
    graph: written in slices of their own transactions, a row is held for its slice only. A lock
    wait in a later slice gives back that slice and the rest; the earlier ones stay written."""
    spec = sixty_four_reviews(conn)
    # The owner's trigger waits for a lock the test holds, on row 9 alone: last in key order
    # ('1', '10', ..., '8', '9'), so past the first slice.
    conn.execute(
        "CREATE FUNCTION wait_on_nine() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.id = 9 THEN PERFORM pg_advisory_xact_lock(4242); END IF; RETURN NEW; END $$"
    )
    conn.execute(
        "CREATE TRIGGER wait_on_nine BEFORE UPDATE ON reviews "
        "FOR EACH ROW EXECUTE FUNCTION wait_on_nine()"
    )
    config = batch.BatchConfig(worker_id="w1", claim_size=64, lease_seconds=60, max_attempts=5)
    with db.connection(db_url) as holder:
        holder.execute("SELECT pg_advisory_lock(4242)")
        result = run_batch(conn, spec, config)
    assert result is not None and result.claimed == 64
    assert result.written >= batch.FIRST_SLICE_ROWS
    assert result.written + result.postponed == 64
    rows = conn.execute("SELECT id FROM reviews WHERE embedding_minilm IS NOT NULL").fetchall()
    assert len(rows) == result.written and (9,) not in rows
    assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (result.postponed,)
    # Nothing lost: once the lock is gone, the rest are written.
    conn.execute("UPDATE pgembed.queue SET next_attempt_at = now()")
    worker.Worker(db_url, worker.Options(once=True)).run()
    assert_every_vector_matches_its_text(conn)
    assert conn.execute("SELECT count(embedding_minilm) FROM reviews").fetchone() == (64,)
    assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)


def test_a_model_changed_between_slices_gives_back_only_the_keys_no_slice_settled(
    conn: psycopg.Connection, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reindex's switch between two slices hands the rest of the batch back, but not a key an
    earlier slice postponed: another worker may have claimed it since, and handing it back made
    it ready for a third one to embed beside that worker."""
    spec = sixty_four_reviews(conn)
    checked = batch._changed
    slices: list[int] = []

    def switched_after_the_first_slice(c: psycopg.Connection, s: registry.ModelSpec) -> bool:
        slices.append(1)
        if len(slices) == 2:
            with db.connection(db_url) as other:
                # Another worker claims key 1, which the first slice postponed (row 1 held) ...
                other.execute("UPDATE pgembed.queue SET next_attempt_at = now() WHERE key = '1'")
                assert [c.key for c in store.claim(other, "minilm", "w2", 10, 60)] == ["1"]
                # ... and a reindex switches the model to other settings (its catalog row).
                other.execute("UPDATE pgembed.models SET pooling = 'cls' WHERE name = 'minilm'")
        return checked(c, s)

    monkeypatch.setattr(batch, "_changed", switched_after_the_first_slice)
    config = batch.BatchConfig(worker_id="w1", claim_size=64, lease_seconds=60, max_attempts=5)
    with db.connection(db_url, autocommit=False) as app:
        app.execute("SELECT 1 FROM reviews WHERE id = 1 FOR UPDATE")
        with pytest.raises(batch.ModelChanged) as changed:
            run_batch(conn, spec, config)
        app.rollback()
    # What the first slice did, for the worker's counts: 32 keys, 31 written, row 1 postponed.
    first = batch.FIRST_SLICE_ROWS
    assert changed.value.done == batch.BatchResult(first, first - 1, 0, postponed=1)
    assert conn.execute("SELECT claimed_by FROM pgembed.queue WHERE key = '1'").fetchone() == (
        "w2",
    )
    left = conn.execute(
        "SELECT count(*) FILTER (WHERE claimed_by IS NULL AND next_attempt_at <= now()), "
        "count(*) FROM pgembed.queue"
    ).fetchone()
    written = conn.execute("SELECT count(embedding_minilm) FROM reviews").fetchone()
    assert written == (batch.FIRST_SLICE_ROWS - 1,)  # the first slice but row 1
    assert left == (64 - batch.FIRST_SLICE_ROWS, 64 - batch.FIRST_SLICE_ROWS + 1)
