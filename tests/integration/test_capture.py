from __future__ import annotations

import psycopg
import pytest

from pgembed import db
from pgembed.lifecycle import models
from pgembed.sync import worker


@pytest.fixture
def watched(reviews: psycopg.Connection) -> psycopg.Connection:
    models.add(reviews, models.AddRequest("minilm", "reviews", "body", precision="fp32"))
    reviews.execute("DELETE FROM pgembed.queue")
    reviews.execute("DELETE FROM pgembed.inbox")
    return reviews


def queued(conn: psycopg.Connection) -> list[str]:
    """Keys waiting: in the queue, or captured into the inbox and not yet moved."""
    return [
        r[0]
        for r in conn.execute(
            "SELECT key FROM pgembed.queue UNION SELECT key FROM pgembed.inbox ORDER BY 1"
        )
    ]


def write_vectors_as_the_worker(conn: psycopg.Connection) -> None:
    """Vectors in every row, flagged as the sync worker flags its writes (a vector written by
    anyone else is replaced: tests/integration/test_keys.py)."""
    with conn.transaction():
        conn.execute("SET LOCAL pgembed.writing = on")
        conn.execute("UPDATE reviews SET embedding_minilm = array_fill(0.1, ARRAY[384])::vector")


def test_insert_enqueues_and_notifies(watched: psycopg.Connection, db_url: str) -> None:
    with db.connection(db_url) as listener:
        listener.execute("LISTEN pgembed")
        watched.execute(
            "INSERT INTO reviews VALUES (100, 'new review', 1), (101, '  ', 1), (102, NULL, 1)"
        )
        notes = list(listener.notifies(timeout=2, stop_after=1))
    # NULL, '' and white-space-only texts are never queued.
    assert queued(watched) == ["100"]
    assert [(n.channel, n.payload) for n in notes] == [("pgembed", "minilm")]
    stats = worker.Worker(db_url, worker.Options(once=True)).run()
    assert (stats.written, stats.skipped) == (1, 0)
    assert queued(watched) == []


def test_bulk_insert_select_and_copy_are_captured(watched: psycopg.Connection) -> None:
    watched.execute(
        "INSERT INTO reviews SELECT g, 'text ' || g, 1 FROM generate_series(100, 599) g"
    )
    with watched.cursor() as cur, cur.copy("COPY reviews (id, body, stars) FROM STDIN") as copy:
        for i in range(600, 700):
            copy.write_row((i, f"copied {i}", 2))
    assert len(queued(watched)) == 600


def test_unrelated_updates_and_the_workers_writes_enqueue_nothing(
    watched: psycopg.Connection,
) -> None:
    watched.execute("UPDATE reviews SET stars = stars + 1")
    watched.execute("UPDATE reviews SET body = body WHERE id = 1")  # same value
    write_vectors_as_the_worker(watched)
    assert queued(watched) == []


def test_text_update_enqueues_and_stops_serving_the_old_vector(watched: psycopg.Connection) -> None:
    write_vectors_as_the_worker(watched)
    watched.execute("UPDATE reviews SET body = 'completely different' WHERE id = 2")
    assert queued(watched) == ["2"]
    rows: dict[int, bool] = dict(
        watched.execute("SELECT id, embedding_minilm IS NULL FROM reviews").fetchall()
    )
    assert rows[2] is True
    assert not any(v for k, v in rows.items() if k != 2)


def test_text_cleared_leaves_the_queue(watched: psycopg.Connection) -> None:
    watched.execute("UPDATE reviews SET body = body || '!' WHERE id IN (1, 2)")
    assert queued(watched) == ["1", "2"]
    watched.execute("UPDATE reviews SET body = '' WHERE id = 1")
    watched.execute("UPDATE reviews SET body = NULL WHERE id = 2")
    assert queued(watched) == []


def test_delete_and_truncate_clear_queue_entries(watched: psycopg.Connection) -> None:
    watched.execute("UPDATE reviews SET body = body || '!'")
    watched.execute("DELETE FROM reviews WHERE id IN (1, 2, 3)")
    assert queued(watched) == ["4", "5", "6", "7", "8"]
    watched.execute("TRUNCATE reviews")
    assert queued(watched) == []


def test_worker_writes_do_not_requeue(watched: psycopg.Connection, db_url: str) -> None:
    watched.execute("UPDATE reviews SET body = body || '!'")
    stats = worker.Worker(db_url, worker.Options(once=True)).run()
    assert stats.written == 8
    assert queued(watched) == []
