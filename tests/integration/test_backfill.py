"""`model add --backfill`: the rows first, then the HNSW index built over them; a stopped
backfill leaves the rows to the daemons and the index to `reindex --index-only`."""

from __future__ import annotations

import json
from collections.abc import Callable

import psycopg
import pytest

from helpers import cli
from pgembed.catalog import ddl, registry
from pgembed.errors import UsageError
from pgembed.lifecycle import backfill, indexbuild, models, reindex
from pgembed.search import planner
from pgembed.sync import worker
from reindex_helpers import TEXTS, assert_vectors, make_table


def status_of(db_url: str) -> dict[str, object]:
    result = cli("--database-url", db_url, "status", "--json")
    assert result.exit_code == 0, result.output
    (model,) = json.loads(result.output)
    return dict(model)


def test_backfill_embeds_every_row_then_builds_the_index(
    conn: psycopg.Connection, db_url: str
) -> None:
    make_table(conn, TEXTS)
    result = cli(
        "--database-url", db_url, "model", "add", "minilm", "--table", "docs", "--column", "body",
        "--precision", "fp32", "--backfill",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "40 rows queued" in result.output and "(run `pgembed sync`)" not in result.output
    assert "index pgembed_minilm_hnsw built" in result.output
    assert_vectors(conn, TEXTS)  # fp32 vectors of every row, as a sync writes them
    assert ddl.index_valid(conn, "public", "pgembed_minilm_hnsw") is True
    status = status_of(db_url)
    assert (status["queued"], status["rows_embedded"], status["index"]) == (0, 40, "built")
    # Rows written afterwards go through the capture triggers and the daemon, into the index.
    conn.execute("INSERT INTO docs VALUES (41, 'The kettle boils water in a minute.', 4)")
    worker.Worker(db_url, worker.Options(once=True)).run()
    spec = registry.get(conn, "minilm")
    assert planner.query(conn, spec, "a kettle that boils water quickly", k=1)[0].key == 41
    # The new row is in the index the backfill built: an index scan finds it.
    nearest = (
        "SELECT id FROM docs ORDER BY embedding_minilm <=> "
        "(SELECT embedding_minilm FROM docs WHERE id = 41) LIMIT 1"
    )
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + nearest))
        assert "pgembed_minilm_hnsw" in plan
        assert conn.execute(nearest).fetchone() == (41,)


def test_a_stopped_backfill_leaves_rows_to_sync_and_the_index_to_reindex(
    conn: psycopg.Connection, db_url: str
) -> None:
    make_table(conn, TEXTS)
    request = models.AddRequest("minilm", "docs", "body", precision="fp32", index=False)
    spec, queued = models.add(conn, request)
    assert queued == 40

    class StopAfterFirstBatch(reindex.Reporter):
        def advance(self, rows: int) -> None:
            runner.stop()

    runner = backfill.Backfill(
        db_url, "minilm", reindex.Options(claim_size=8), StopAfterFirstBatch()
    )
    assert runner.run() is None
    (embedded,) = conn.execute("SELECT count(embedding_minilm) FROM docs").fetchone() or (0,)
    assert 8 <= embedded < 40  # the batches in hand (one prefetched) are written, no more
    assert ddl.index_valid(conn, "public", "pgembed_minilm_hnsw") is None
    text = cli("--database-url", db_url, "status")
    assert "HNSW index missing: searches scan the column exactly" in text.output
    assert "`pgembed reindex minilm --index-only` builds it" in text.output
    # Searches work meanwhile, by an exact scan of the rows embedded so far.
    (first,) = conn.execute("SELECT id FROM docs WHERE embedding_minilm IS NOT NULL LIMIT 1")
    assert planner.query(conn, spec, TEXTS[first[0]], k=1)[0].key == first[0]

    worker.Worker(db_url, worker.Options(once=True)).run()  # the daemons finish the rows
    assert_vectors(conn, TEXTS)
    result = cli("--database-url", db_url, "reindex", "minilm", "--index-only")
    assert result.exit_code == 0, result.output
    assert status_of(db_url)["index"] == "built"


def test_backfill_refuses_a_reindex_shadow(conn: psycopg.Connection, db_url: str) -> None:
    make_table(conn, TEXTS)
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    shadow, _ = reindex.begin(conn, "minilm", None)
    with pytest.raises(UsageError, match="is a reindex shadow"):
        backfill.Backfill(db_url, shadow.name, reindex.Options()).run()


def test_a_backfill_whose_table_breaks_stops_and_says_why(
    conn: psycopg.Connection, db_url: str
) -> None:
    """The fill of a model whose table its worker would skip (here an inheritance child made
    after `model add`) stops in one line instead of waiting for ever; so does a backfill of a
    model removed meanwhile. Its rows stay queued for the daemons."""
    make_table(conn, TEXTS)
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32", index=False))
    conn.execute("CREATE TABLE public.more_docs () INHERITS (public.docs)")
    with pytest.raises(UsageError) as stopped:
        backfill.Backfill(db_url, "minilm", reindex.Options()).run()
    assert str(stopped.value).startswith(
        "the backfill of minilm cannot go on: table public.docs has inheritance children "
        "(public.more_docs): not supported"
    )
    assert "its rows stay queued for `pgembed sync`" in str(stopped.value)
    assert status_of(db_url)["queued"] == len(TEXTS)
    spec = registry.get(conn, "minilm")
    models.remove(conn, "minilm")
    assert reindex.cannot_go_on(conn, spec) == "model 'minilm' was removed meanwhile"


class Hook(reindex.Reporter):
    """Calls `at_build` when the backfill's index build starts."""

    def __init__(self, at_build: Callable[[], None]) -> None:
        self.at_build = at_build

    def phase(self, text: str) -> None:
        if text == "building index":
            self.at_build()


def test_rows_written_during_the_build_are_embedded_too(
    conn: psycopg.Connection, db_url: str
) -> None:
    make_table(conn, TEXTS)
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32", index=False))
    late = {41: "The kettle boils water in a minute."}

    def insert_late() -> None:
        conn.execute("INSERT INTO docs VALUES (41, %s, 4)", (late[41],))

    hook = Hook(insert_late)
    assert backfill.Backfill(db_url, "minilm", reindex.Options(), hook).run() is not None
    assert_vectors(conn, {**TEXTS, **late})
    assert status_of(db_url)["queued"] == 0


def test_a_build_stopped_midway_leaves_no_invalid_index_behind(
    conn: psycopg.Connection, db_url: str
) -> None:
    make_table(conn, TEXTS)
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32", index=False))
    # A transaction with an older snapshot holds the concurrent build in its last wait, where
    # the stop cancels it; the cancelled build's invalid index would still cost every write.
    reader = psycopg.connect(db_url)
    reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")

    def hold_and_stop() -> None:
        reader.execute("SELECT 1")  # the snapshot the build will wait for
        runner.stop()

    hook = Hook(hold_and_stop)
    options = reindex.Options(build=indexbuild.BuildSettings(poll_seconds=0.05))
    runner = backfill.Backfill(db_url, "minilm", options, hook)
    try:
        assert runner.run() is None
    finally:
        reader.rollback()
        reader.close()
    assert ddl.index_valid(conn, "public", "pgembed_minilm_hnsw") is None
    assert status_of(db_url)["index"] == "missing"
