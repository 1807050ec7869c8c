"""What the tests of `pgembed alter-table` look at: the vectors and the capture triggers of
`reviews`, and a pass of the sync worker."""

from __future__ import annotations

import psycopg

from pgembed.sync import worker


def synced(db_url: str) -> None:
    worker.Worker(db_url, worker.Options(once=True)).run()


def vectors(conn: psycopg.Connection) -> dict[int, str]:
    rows = conn.execute("SELECT id, embedding_minilm::text FROM reviews").fetchall()
    return dict(rows)


def triggers(conn: psycopg.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'reviews'::regclass AND NOT tgisinternal "
        "ORDER BY tgname"
    ).fetchall()
    return [name for (name,) in rows]
