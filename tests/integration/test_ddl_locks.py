"""DDL on a watched table waits for its lock in short attempts: a long reader holds up
`model add`/`model remove`, never the application's other queries for more than the timeout."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

from pgembed import db, defaults
from pgembed.catalog import ddl, registry
from pgembed.errors import DatabaseError
from pgembed.lifecycle import models

TIMEOUT = float(defaults.DDL_LOCK_TIMEOUT.removesuffix("s"))


@pytest.fixture
def docs(conn: psycopg.Connection) -> psycopg.Connection:
    conn.execute("CREATE TABLE public.docs (id int PRIMARY KEY, body text)")
    conn.execute("INSERT INTO public.docs SELECT i, 'document ' || i FROM generate_series(1, 5) i")
    return conn


@contextmanager
def long_reader(url: str) -> Iterator[int]:
    """An open transaction that has read public.docs (it holds ACCESS SHARE): its pid."""
    with psycopg.connect(url) as reader:
        reader.execute("SELECT count(*) FROM public.docs").fetchone()
        yield reader.info.backend_pid
        reader.rollback()


class Background:
    """Runs `work(conn, on_wait)` on its own connection; collects the waiting lines."""

    def __init__(self, url: str, work: Callable[[psycopg.Connection, ddl.OnWait], object]) -> None:
        self.lines: list[str] = []
        self.error: BaseException | None = None
        self._url, self._work = url, work
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        try:
            with db.connection(self._url) as conn:
                self._work(conn, self.lines.append)
        except BaseException as exc:
            self.error = exc

    def wait_for_line(self, seconds: float = 60.0) -> str:
        deadline = time.monotonic() + seconds
        while not self.lines and time.monotonic() < deadline and self.thread.is_alive():
            time.sleep(0.05)
        assert self.lines, f"no waiting line (error: {self.error!r})"
        return self.lines[0]


def timed(conn: psycopg.Connection, statement: str) -> float:
    started = time.monotonic()
    conn.execute(statement)
    return time.monotonic() - started


def test_model_add_waits_behind_a_long_reader_without_blocking_other_queries(
    db_url: str, docs: psycopg.Connection
) -> None:
    request = models.AddRequest("minilm", "docs", "body", precision="fp32")
    with long_reader(db_url) as reader_pid:
        adding = Background(db_url, lambda c, say: models.add(c, request, on_wait=say))
        line = adding.wait_for_line()
        assert line.startswith("waiting for a lock on table public.docs")
        assert f"pid {reader_pid}" in line
        # While it retries, reads and writes of the table go on, each within about one timeout
        # (one may queue behind an attempt): through at least one more whole attempt.
        waits: list[float] = []
        with psycopg.connect(db_url, autocommit=True) as app:
            app.execute("SET statement_timeout = '10s'")
            for i in range(6, 200):
                waits.append(timed(app, f"INSERT INTO public.docs VALUES ({i}, 'document {i}')"))
                waits.append(timed(app, "SELECT count(*) FROM public.docs"))
                if len(adding.lines) >= 2:
                    break
                time.sleep(0.1)
        assert max(waits) < TIMEOUT + 1.5, waits
        assert adding.thread.is_alive() and len(adding.lines) >= 2
        # Nothing of a timed-out attempt is left: no catalog row, no column.
        assert not registry.exists(docs, "minilm")
        columns = docs.execute(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = 'public.docs'::regclass "
            "AND attname = 'embedding_minilm'"
        ).fetchone()
        assert columns == (0,)
    adding.thread.join(defaults.DDL_RETRY_MAX_PAUSE + TIMEOUT + 5)
    assert not adding.thread.is_alive() and adding.error is None
    assert registry.exists(docs, "minilm")
    queued = docs.execute(
        "SELECT (SELECT count(*) FROM pgembed.queue WHERE model = 'minilm'), "
        "(SELECT count(*) FROM public.docs)"
    ).fetchone()
    assert queued and queued[0] == queued[1] > 5  # the rows inserted while it waited too
    print(f"longest wait of an application query: {max(waits):.2f} s of {len(waits)}")


def test_model_remove_waits_behind_a_long_reader(db_url: str, docs: psycopg.Connection) -> None:
    models.add(docs, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    with long_reader(db_url) as reader_pid:
        removing = Background(db_url, lambda c, say: models.remove(c, "minilm", on_wait=say))
        assert f"pid {reader_pid}" in removing.wait_for_line()
        assert registry.exists(docs, "minilm")
    removing.thread.join(defaults.DDL_RETRY_MAX_PAUSE + TIMEOUT + 5)
    assert removing.error is None and not registry.exists(docs, "minilm")


def test_a_lock_never_had_gives_up_with_one_line_and_leaves_nothing(
    db_url: str, docs: psycopg.Connection
) -> None:
    docs.execute("CREATE TABLE public.attempts (n int)")
    spec = models.add(docs, models.AddRequest("minilm", "docs", "body", precision="fp32"))[0]

    def attempt() -> None:
        docs.execute("INSERT INTO public.attempts VALUES (1)")
        ddl.lock_table(docs, spec)

    lines: list[str] = []
    with long_reader(db_url) as reader_pid, pytest.raises(DatabaseError) as raised:
        ddl.retrying_locks(docs, "public", "docs", attempt, lines.append, wait_seconds=3)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("gave up after 3 s waiting for a lock on table public.docs")
    assert f"pid {reader_pid}" in message and "run the command again" in message
    assert lines and docs.execute("SELECT count(*) FROM public.attempts").fetchone() == (0,)


def test_model_fulltext_says_which_transaction_it_waits_for_and_blocks_nobody(
    db_url: str, docs: psycopg.Connection
) -> None:
    models.add(docs, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    with psycopg.connect(db_url) as writer:  # an open write transaction: CIC waits for it
        writer.execute("INSERT INTO public.docs VALUES (100, 'written, not committed')")
        building = Background(
            db_url, lambda c, say: models.add_fulltext_index(c, "minilm", url=db_url, on_wait=say)
        )
        line = building.wait_for_line()
        pid = writer.info.backend_pid
        assert f"waits for the transaction of pid {pid} (idle in transaction for " in line
        with psycopg.connect(db_url, autocommit=True) as app:
            app.execute("SET statement_timeout = '5s'")
            assert timed(app, "INSERT INTO public.docs VALUES (101, 'meanwhile')") < 1
            assert timed(app, "SELECT count(*) FROM public.docs") < 1
        assert building.thread.is_alive()
        writer.commit()
    building.thread.join(30)
    assert not building.thread.is_alive() and building.error is None
    valid = docs.execute(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = 'public.pgembed_minilm_fts'::regclass"
    ).fetchone()
    assert valid == (True,)
