"""`model add`, `model remove` and a reindex's start never hold the application's writes for more
than a moment, resume when interrupted without losing a row, and say what they are doing: the
precision check, the index build's progress and what it waits for, a memory hint."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import psycopg
import pytest
from app_writer import Writer
from pgvector import Vector

from helpers import run_cli_here, writing_vectors
from pgembed import db
from pgembed.catalog import ddl, registry
from pgembed.errors import UsageError
from pgembed.lifecycle import indexbuild, models, reindex, setup

ROWS = 30_000


def make_docs(conn: psycopg.Connection, rows: int = ROWS) -> None:
    conn.execute("CREATE TABLE public.docs (id bigint PRIMARY KEY, body text)")
    conn.execute(
        "INSERT INTO public.docs SELECT g, 'document number ' || g FROM generate_series(1, %s) g",
        (rows,),
    )
    conn.execute("ANALYZE public.docs")


def missing_keys(conn: psycopg.Connection, model: str) -> int:
    """Rows with text that are neither embedded nor queued (queue or inbox) for `model`."""
    row = conn.execute(
        "SELECT count(*) FROM public.docs d WHERE NOT EXISTS (SELECT 1 FROM pgembed.queue q "
        "WHERE q.model = %(m)s AND q.key = d.id::text) AND NOT EXISTS (SELECT 1 FROM "
        "pgembed.inbox i WHERE i.model = %(m)s AND i.key = d.id::text)",
        {"m": model},
    ).fetchone()
    return int(row[0]) if row else -1


def test_model_add_never_holds_a_writer_for_more_than_a_moment(
    conn: psycopg.Connection, db_url: str
) -> None:
    make_docs(conn)
    request = models.AddRequest("minilm", "docs", "body", precision="fp32")
    with Writer(db_url, ROWS + 1) as writer:
        time.sleep(0.3)
        started = time.monotonic()
        spec, queued = models.add(conn, request, url=db_url)
        took = time.monotonic() - started
        time.sleep(0.3)
    print(f"model add on {ROWS} rows: {took:.1f} s; writer's longest commit {writer.longest:.3f} s")
    assert writer.commits > 10 and 0 <= writer.longest < 1.0
    assert queued >= ROWS and missing_keys(conn, "minilm") == 0
    assert setup.pending(conn, "minilm") is None
    assert ddl.index_valid(conn, "public", "pgembed_minilm_hnsw") is True
    # A reindex's start and a removal are as short for the writer.
    with Writer(db_url, 10 * ROWS) as writer:
        time.sleep(0.3)
        shadow, _ = reindex.begin(conn, "minilm", reindex.Change(pooling="cls"))
        assert missing_keys(conn, shadow.name) == 0
        models.remove(conn, spec.name)
        time.sleep(0.3)
    assert writer.commits > 10 and 0 <= writer.longest < 1.0
    left = conn.execute("SELECT count(*) FROM pgembed.queue").fetchone()
    assert left == (0,) and not registry.exists(conn, shadow.name)


KILLED_ADD = """
import os, signal, sys
from pgembed import db
from pgembed.lifecycle import models, setup

class KillAfterFirstBatch(setup.Reporter):
    def queued(self, done, estimate):
        os.kill(os.getpid(), signal.SIGKILL)  # after the first batch committed

url = sys.argv[1]
with db.connection(url) as conn:
    request = models.AddRequest("minilm", "docs", "body", precision="fp32")
    models.add(conn, request, url=url, reporter=KillAfterFirstBatch())
"""


def test_an_add_killed_while_queuing_resumes_and_loses_no_row(
    conn: psycopg.Connection, db_url: str
) -> None:
    make_docs(conn)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_ADD, db_url],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parent.parent.parent,
    )
    assert killed.returncode == -9, killed.stderr
    assert setup.pending(conn, "minilm") == setup.Pending(index=False, fulltext=False)
    queued = conn.execute("SELECT count(*) FROM pgembed.queue WHERE model = 'minilm'").fetchone()
    assert queued is not None and 0 < queued[0] < ROWS  # one batch of the rows
    conn.execute("INSERT INTO public.docs VALUES (%s, 'written after the kill')", (ROWS + 1,))
    # An interrupted index build leaves an invalid index: the resume drops it and builds again.
    conn.execute('DROP INDEX public."pgembed_minilm_hnsw"')
    invalid_index(conn, db_url, "pgembed_minilm_hnsw")
    setup.mark(conn, "minilm", setup.Pending(index=True, fulltext=False))

    resumed = run_cli_here(
        "--database-url", db_url, "model", "add", "minilm", "--table", "docs", "--column", "body",
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "model minilm was not completely set up: finishing its setup" in resumed.stderr
    assert missing_keys(conn, "minilm") == 0
    assert setup.pending(conn, "minilm") is None
    assert ddl.index_valid(conn, "public", "pgembed_minilm_hnsw") is True


def invalid_index(conn: psycopg.Connection, url: str, name: str) -> None:
    """What a CREATE INDEX CONCURRENTLY stopped half-way leaves: an index marked invalid."""
    spec = registry.get(conn, "minilm")
    with snapshot_holder(url), db.connection(url) as builder:
        builder.execute("SET statement_timeout = '300ms'")
        with suppress(psycopg.errors.QueryCanceled):
            ddl.create_index(builder, spec, concurrently=True, name=name)
    assert ddl.index_valid(conn, "public", name) is False


@contextmanager
def snapshot_holder(url: str) -> Iterator[psycopg.Connection]:
    """A session idle in a repeatable-read transaction: it keeps its snapshot, which a
    CREATE INDEX CONCURRENTLY anywhere in the database waits for."""
    with psycopg.connect(url) as older:
        older.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        older.execute("SELECT count(*) FROM pg_catalog.pg_class").fetchone()
        yield older
        older.rollback()


@contextmanager
def cli_process(*args: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "pgembed", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parent.parent.parent,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(30)


def test_model_add_says_what_it_does_in_order(conn: psycopg.Connection, db_url: str) -> None:
    make_docs(conn, 200)
    result = run_cli_here(
        "--database-url", db_url, "model", "add", "minilm", "--table", "docs", "--column", "body",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    wanted = [
        "loading all-MiniLM-L6-v2",  # the first line, once the request is checked
        "checking precision ",  # auto: each candidate is checked against fp32, said as it starts
        "registering model minilm",
        "building index pgembed_minilm_hnsw (concurrently)",
        "queuing the existing rows of public.docs",
    ]
    at = [next(i for i, line in enumerate(lines) if line.startswith(w)) for w in wanted]
    assert at == sorted(at), lines
    assert lines[0].startswith("loading all-MiniLM-L6-v2")
    assert "200 rows queued" in result.stdout


def test_the_index_build_names_the_transaction_it_waits_for(
    conn: psycopg.Connection, db_url: str
) -> None:
    make_docs(conn, 100)
    with snapshot_holder(db_url) as older:
        pid = older.info.backend_pid
        args = ("model", "add", "minilm", "--table", "docs", "--column", "body")
        with cli_process("--database-url", db_url, *args, "--precision", "fp32") as adding:
            assert adding.stderr is not None
            seen: list[str] = []
            for line in adding.stderr:
                seen.append(line)
                if "the index build waits for" in line:
                    break
            assert seen, adding.communicate()
            assert f"the transaction of pid {pid} (idle in transaction for " in seen[-1], seen
            assert adding.poll() is None  # still waiting
            older.rollback()
            out, err = adding.communicate(timeout=120)
    assert adding.returncode == 0, err
    assert "100 rows queued" in out


def test_an_index_build_reports_its_phases_and_a_memory_too_small(
    conn: psycopg.Connection, db_url: str
) -> None:
    rows = 3000
    conn.execute("CREATE TABLE public.docs (id bigint PRIMARY KEY, body text)")
    request = models.AddRequest("minilm", "docs", "body", precision="fp32", index=False)
    spec = models.add(conn, request)[0]
    vectors = np.random.default_rng(3).normal(size=(rows, spec.dimensions)).astype(np.float32)
    copy = "COPY public.docs (id, body, embedding_minilm) FROM STDIN (FORMAT BINARY)"
    with writing_vectors(conn), conn.cursor() as cur, cur.copy(copy) as out:
        out.set_types(["bigint", "text", "vector"])
        for i, vector in enumerate(vectors):
            out.write_row((i, f"doc {i}", Vector(vector)))
    conn.execute("ANALYZE public.docs")
    samples: list[indexbuild.BuildProgress] = []
    notes: list[str] = []
    settings = indexbuild.BuildSettings("1MB", poll_seconds=0.05)
    rebuilt = indexbuild.rebuild(
        db_url, "minilm", None, None, settings, samples.append, on_note=notes.append
    )
    assert rebuilt is not None
    phases = {s.phase for s in samples}
    assert any(p.startswith("building index") for p in phases), phases
    assert all(0 <= s.done <= s.total for s in samples if s.total)
    needed = -(-indexbuild.graph_bytes(rows, spec.dimensions, spec.hnsw_m) // 2**20)
    assert any(f"--maintenance-work-mem {needed}MB" in n for n in notes), notes
    assert any("no longer fits into maintenance_work_mem" in n for n in notes), notes
    # Unnamed, the memory is derived from the table's size: at least the default, here.
    derived = indexbuild.memory_for(
        conn, spec, indexbuild.BuildSettings(), filled=True, say=notes.append
    )
    assert derived == "1024MB"


def test_a_reindex_whose_start_was_cut_short_queues_the_rest_before_it_fills(
    conn: psycopg.Connection, db_url: str
) -> None:
    make_docs(conn, 60)
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    shadow, queued = reindex.begin(conn, "minilm", reindex.Change(pooling="cls"))
    assert queued == 60
    # As if killed after its first batch: part of the keys queued, the setup not marked done.
    conn.execute("DELETE FROM pgembed.queue WHERE model = %s AND key::int > 20", (shadow.name,))
    setup.mark(conn, shadow.name, setup.Pending(index=False, fulltext=False))
    switched = reindex.Reindex(db_url, "minilm", reindex.Options()).run()
    assert switched is not None and switched.pooling == "cls"
    embedded = conn.execute("SELECT count(embedding_minilm) FROM public.docs").fetchone()
    assert embedded == (60,)


def test_an_index_over_a_new_empty_column_asks_for_no_memory_or_workers(
    conn: psycopg.Connection,
) -> None:
    """`model add` builds its index over a column with no vector yet: the server's own
    maintenance_work_mem and no parallel workers (each would get a shared-memory segment of
    that size for nothing: a container's 64 MB /dev/shm fails them). A filled column gets both."""
    make_docs(conn, 60)
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    spec = registry.get(conn, "minilm")
    before = conn.execute("SHOW maintenance_work_mem").fetchone()
    settings = indexbuild.BuildSettings()
    notes: list[str] = []
    assert indexbuild._prepare(conn, spec, "not_built_yet", settings, False, notes.append)
    assert conn.execute("SHOW maintenance_work_mem").fetchone() == before
    assert conn.execute("SHOW max_parallel_maintenance_workers").fetchone() == ("0",)
    assert indexbuild._prepare(conn, spec, "not_built_yet", settings, True, notes.append)
    assert conn.execute("SHOW maintenance_work_mem").fetchone() == ("1GB",)
    assert conn.execute("SHOW max_parallel_maintenance_workers").fetchone() == (
        str(settings.parallel_workers),
    )


def test_a_second_add_of_the_name_leaves_the_firsts_rows(
    conn: psycopg.Connection, db_url: str
) -> None:
    """The cleanup of an interrupted removal's leftovers never takes a registered model's queue:
    a second `model add` of the name, started before the first registered, stops with a clear
    line instead (it once deleted the first one's queue, so its rows were never embedded)."""
    make_docs(conn, 300)
    spec, queued = models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    assert queued == 300
    assert not setup.leftovers(conn, "minilm")
    setup.forget(conn, "minilm")  # what the second add's cleanup would run
    assert missing_keys(conn, "minilm") == 0
    with pytest.raises(UsageError, match="model 'minilm' already exists"), conn.transaction():
        registry.insert(conn, spec)  # the second add's registration, after the first's commit

    models.remove(conn, "minilm")  # now its rows are leftovers, deleted before a new add
    conn.execute("INSERT INTO pgembed.queue (model, key) VALUES ('minilm', '1')")
    assert setup.leftovers(conn, "minilm")


def test_an_interrupted_add_says_how_to_finish_and_keeps_its_settings(
    conn: psycopg.Connection, db_url: str
) -> None:
    make_docs(conn, 50)
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    # What a Ctrl-C before the rows were queued and the index built leaves.
    conn.execute("DELETE FROM pgembed.queue WHERE model = 'minilm'")
    conn.execute('DROP INDEX public."pgembed_minilm_hnsw"')
    setup.mark(conn, "minilm", setup.Pending(index=True, fulltext=False))
    url = ("--database-url", db_url)

    shown = run_cli_here(*url, "status")
    assert "setup not finished (adding+index): unless a `pgembed model add minilm`" in shown.stdout
    assert "--index-only" not in shown.stdout  # that would build the index, never queue a row
    assert json.loads(run_cli_here(*url, "status", "--json").stdout)[0]["setup"] == "adding+index"
    searched = run_cli_here(*url, "query", "a film", "--model", "minilm")
    assert searched.returncode != 0
    assert "model 'minilm' is not completely set up: unless a `pgembed model add" in searched.stderr

    add = (*url, "model", "add", "minilm", "--table", "docs", "--column", "body")
    other = run_cli_here(*add, "--pooling", "cls", "--query-prefix", "q: ")
    assert other.returncode != 0
    assert other.stderr.strip().endswith(
        "model minilm was not completely set up, with other settings (pooling, query-prefix): "
        "run the same `model add` again to finish it, or `pgembed model remove minilm` first"
    )
    assert setup.pending(conn, "minilm") == setup.Pending(index=True, fulltext=False)
    # In a transaction (lifecycle.models.add's other mode), the advice is the same: not the
    # interrupted `--backfill`'s (sync, then reindex --index-only), which would queue no row.
    with psycopg.connect(db_url) as in_transaction, pytest.raises(UsageError) as refused:
        models.add(in_transaction, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    assert str(refused.value).startswith(
        "model 'minilm' was not completely set up: the same `model add` finishes it"
    )
    finished = run_cli_here(*add)
    assert finished.returncode == 0, finished.stderr
    assert missing_keys(conn, "minilm") == 0
    assert json.loads(run_cli_here(*url, "status", "--json").stdout)[0]["setup"] is None
