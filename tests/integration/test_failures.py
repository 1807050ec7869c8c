"""Failures are data: bisected out of their batch, retried with backoff, then kept for `retry`."""

from __future__ import annotations

import json

import psycopg
import pytest

from helpers import cli, make_due, run_batch
from pgembed import db
from pgembed.catalog import registry
from pgembed.lifecycle import models
from pgembed.sync import batch


@pytest.fixture
def poisoned(reviews: psycopg.Connection) -> psycopg.Connection:
    """Two rows the real model cannot encode.

    The catalog claims a max sequence length beyond the checkpoint's 512 positions (`model add`
    refuses that; an edited catalog is how it happens), so texts longer than 512 word pieces make
    the model itself raise, while every shorter text embeds normally.
    """
    models.add(reviews, models.AddRequest("minilm", "reviews", "body", precision="fp32"))
    reviews.execute("UPDATE pgembed.models SET max_seq_length = 1024")
    long_text = "The battery gave up after a single afternoon of light use. " * 60
    reviews.execute("INSERT INTO reviews VALUES (90, %s, 1), (91, %s, 1)", (long_text, long_text))
    return reviews


def test_model_add_refuses_a_length_the_checkpoint_cannot_read(reviews: psycopg.Connection) -> None:
    with pytest.raises(Exception, match="exceeds what 'all-MiniLM-L6-v2' can read"):
        models.add(reviews, models.AddRequest("m", "reviews", "body", max_seq_length=1024))


def test_poison_rows_fail_alone_retry_then_move_to_failures(
    poisoned: psycopg.Connection, db_url: str
) -> None:
    first = cli("--database-url", db_url, "sync", "--once", "--max-attempts", "2")
    assert first.exit_code == 0, first.output
    assert "8 written" in first.output and "2 failed" in first.output
    assert "2 rows wait for a retry" in first.output
    queued = poisoned.execute(
        "SELECT key, attempts, last_error, next_attempt_at > now() FROM pgembed.queue ORDER BY key"
    ).fetchall()
    assert [(k, a, later) for k, a, _, later in queued] == [("90", 1, True), ("91", 1, True)]
    assert all("size of tensor" in err or "index" in err.lower() for _, _, err, _ in queued)

    backoff = poisoned.execute(
        "SELECT extract(epoch FROM max(next_attempt_at) - now()) FROM pgembed.queue"
    ).fetchone()
    assert backoff is not None and 0 < float(backoff[0]) <= 2.5, backoff  # the first: 2 s
    assert make_due(poisoned) == 2  # the first backoff over
    second = cli("--database-url", db_url, "sync", "--once", "--max-attempts", "2")
    assert "2 failed" in second.output
    assert poisoned.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
    failures = poisoned.execute(
        "SELECT key, attempts FROM pgembed.failures ORDER BY key"
    ).fetchall()
    assert failures == [("90", 2), ("91", 2)]

    status = json.loads(cli("--database-url", db_url, "status", "--json").output)[0]
    assert status["failed"] == 2 and status["rows_embedded"] == 8
    text = cli("--database-url", db_url, "status").output
    assert "recent failures" in text and "key=90" in text

    # Fix the cause, requeue, and the rows go through.
    poisoned.execute("UPDATE pgembed.models SET max_seq_length = 256")
    retried = cli("--database-url", db_url, "retry", "--model", "minilm")
    assert retried.exit_code == 0 and "requeued 2" in retried.output
    assert poisoned.execute("SELECT count(*) FROM pgembed.failures").fetchone() == (0,)
    cli("--database-url", db_url, "sync", "--once")
    assert poisoned.execute("SELECT count(embedding_minilm) FROM reviews").fetchone() == (10,)


def test_a_batch_given_back_for_a_lock_still_counts_its_failed_rows(
    poisoned: psycopg.Connection, db_url: str
) -> None:
    """A write-back that meets a lock gives its rows back for later, but the ones the model
    failed on are recorded as failed attempts: a batch that kept meeting the lock retried them
    past --max-attempts, embedding them again each time."""
    poisoned.execute(
        "CREATE FUNCTION wait_on_two() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.id = 2 THEN PERFORM pg_advisory_xact_lock(4343); END IF; RETURN NEW; END $$"
    )
    poisoned.execute(
        "CREATE TRIGGER wait_on_two BEFORE UPDATE ON reviews "
        "FOR EACH ROW EXECUTE FUNCTION wait_on_two()"
    )
    spec = registry.get(poisoned, "minilm")
    config = batch.BatchConfig(worker_id="w1", claim_size=100, lease_seconds=60, max_attempts=5)
    with db.connection(db_url) as holder:
        holder.execute("SELECT pg_advisory_lock(4343)")
        result = run_batch(poisoned, spec, config)
    assert result is not None
    assert (result.claimed, result.written, result.failed, result.postponed) == (10, 0, 2, 8)
    tried = poisoned.execute(
        "SELECT key, attempts, last_error IS NOT NULL FROM pgembed.queue ORDER BY key::integer"
    ).fetchall()
    assert [row for row in tried if row[1] > 0] == [("90", 1, True), ("91", 1, True)]


def test_a_key_the_key_type_cannot_read_fails_alone(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    # A queued key that is not an integer (queued by hand here) made the read of its whole batch
    # fail at every claim: none of its neighbours was ever embedded, and nothing said why.
    reviews.execute(
        "INSERT INTO pgembed.queue (model, key) VALUES ('minilm', 'not-a-key'), ('minilm', '1e99')"
    )
    config = batch.BatchConfig(worker_id="w1", claim_size=100, lease_seconds=60, max_attempts=2)
    result = run_batch(reviews, spec, config)
    # Counted as failed, in the batch's figures and so in `sync --once`'s summary.
    assert result is not None and (result.claimed, result.written, result.failed) == (10, 8, 2)
    retrying = reviews.execute("SELECT key, attempts, last_error FROM pgembed.queue ORDER BY key")
    rows = retrying.fetchall()
    assert [(key, attempts) for key, attempts, _ in rows] == [("1e99", 1), ("not-a-key", 1)]
    assert "reading key 'not-a-key' failed: invalid input syntax for type integer" in rows[1][2]
    # Retried with backoff like any failure, then kept in the failures.
    reviews.execute("UPDATE pgembed.queue SET next_attempt_at = now()")
    again = cli("--database-url", db_url, "sync", "--once", "--max-attempts", "2")
    assert "synced: 0 written, 0 skipped, 2 failed" in again.output  # neither readable
    failures = reviews.execute("SELECT key, attempts FROM pgembed.failures ORDER BY key")
    assert failures.fetchall() == [("1e99", 2), ("not-a-key", 2)]
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
