"""Online reindex: shadow fill, atomic switch, searches during it, stale workers (a killed one
resuming: acceptance/test_reindex_killed.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pgvector import Vector

from helpers import cli, run_batch, search_on, writing_vectors
from pgembed import db
from pgembed.catalog import ddl, registry
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.lifecycle import indexbuild, models, reindex
from pgembed.search import planner
from pgembed.sync import batch, worker
from reindex_helpers import TEXTS, assert_vectors, encode, make_table, stored


@pytest.fixture
def synced(conn: psycopg.Connection, db_url: str) -> registry.ModelSpec:
    """40 rows embedded by `minilm` (all-MiniLM-L6-v2, mean pooling)."""
    make_table(conn, TEXTS)
    # fp32: the vectors these tests expect are fp32's on every CPU (auto is bf16 where native).
    spec = models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))[0]
    worker.Worker(db_url, worker.Options(once=True)).run()
    return spec


def objects(conn: psycopg.Connection) -> tuple[set[str], set[str], set[str]]:
    columns = {
        r[0]
        for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'docs'::regclass AND attnum > 0 "
            "AND NOT attisdropped"
        )
    }
    indexes = {
        r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'docs'")
    }
    triggers = {
        r[0]
        for r in conn.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'docs'::regclass AND NOT tgisinternal"
        )
    }
    return columns, indexes, triggers


def test_alter_pooling_switches_to_new_vectors_and_keeps_capturing(
    synced: registry.ModelSpec, conn: psycopg.Connection, db_url: str
) -> None:
    result = cli("--database-url", db_url, "model", "alter", "minilm", "--pooling", "cls")
    assert result.exit_code == 0, result.output
    assert "version 2" in result.output and "is live" in result.output
    # The column now holds CLS vectors, which really differ from the mean ones.
    assert_vectors(conn, TEXTS, pooling="cls")
    mean, cls = encode([TEXTS[1]]), encode([TEXTS[1]], pooling="cls")
    assert float(mean[0] @ cls[0]) < 0.95
    spec = registry.get(conn, "minilm")
    assert (spec.pooling, spec.version, spec.embedding_column) == ("cls", 2, "embedding_minilm")
    history = conn.execute(
        "SELECT version, pooling, activated_at IS NOT NULL FROM pgembed.model_versions "
        "WHERE name = 'minilm' ORDER BY version"
    ).fetchall()
    assert history == [(1, "mean", True), (2, "cls", True)]
    assert [s.name for s in registry.all_models(conn)] == ["minilm"]
    columns, indexes, triggers = objects(conn)
    assert columns == {"id", "body", "stars", "embedding_minilm"}
    assert indexes == {"docs_pkey", "pgembed_minilm_hnsw"}
    assert triggers == {f"pgembed_minilm_{e}" for e in ("ins", "upd", "del", "trunc", "vec")}
    # The recreated triggers capture changes for the model's column under its new settings.
    conn.execute("UPDATE docs SET body = 'The speaker hums loudly.' WHERE id = 1")
    assert stored(conn).get(1) is None
    assert conn.execute("SELECT model, key FROM pgembed.queue").fetchall() == [("minilm", "1")]
    worker.Worker(db_url, worker.Options(once=True)).run()
    np.testing.assert_allclose(
        stored(conn)[1], encode(["The speaker hums loudly."], pooling="cls")[0], atol=1e-5
    )


class Searcher(threading.Thread):
    """Searches the way applications do, over and over, and records what each search saw."""

    def __init__(self, url: str, old: dict[int, np.ndarray], new: dict[int, np.ndarray]) -> None:
        super().__init__(daemon=True)
        self.url, self.old, self.new = url, old, new
        self.query = old[1]
        self.done = threading.Event()
        self.errors: list[BaseException] = []
        self.kinds: list[str] = []  # per plain-SQL read of all vectors: "old" or "new"
        self.empty = 0
        self.searches = 0

    def run(self) -> None:
        with db.connection(self.url) as conn:
            while not self.done.is_set():
                try:
                    self.search_once(conn)
                except BaseException as exc:  # every failure is a test failure
                    self.errors.append(exc)

    def search_once(self, conn: psycopg.Connection) -> None:
        # The documented plain SQL: ORDER BY embedding_<model> <=> $1 LIMIT k.
        top = conn.execute(
            "SELECT id, embedding_minilm <=> %s FROM docs ORDER BY embedding_minilm <=> %s LIMIT 5",
            (self.query, self.query),
        ).fetchall()
        self.empty += len(top) < 5 or any(distance is None for _, distance in top)
        # One statement reads every vector: all of them must come from one version's settings.
        rows = conn.execute(  # row 1 changes text during the reindex: it proves nothing here
            "SELECT id, embedding_minilm FROM docs "
            "WHERE embedding_minilm IS NOT NULL AND id BETWEEN 2 AND 40"
        ).fetchall()
        kinds = {self.kind(key, vec.to_numpy()) for key, vec in rows}
        assert len(kinds) == 1, kinds
        self.kinds.append(kinds.pop())
        hits = planner.query(conn, registry.get(conn, "minilm"), "battery died quickly", k=3)
        self.empty += len(hits) < 3
        self.searches += 1

    def kind(self, key: int, vec: np.ndarray) -> str:
        if np.allclose(vec, self.old[key], atol=1e-4):
            return "old"
        assert np.allclose(vec, self.new[key], atol=1e-4), f"row {key} has a vector of neither"
        return "new"


class ChangeRowsOnce(reindex.Reporter):
    """The application writes while the reindex runs: after its first batch."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.changed = False
        self.live_after_change: dict[int, np.ndarray] = {}

    def advance(self, rows: int) -> None:
        if self.changed:
            return
        self.changed = True
        with db.connection(self.url) as conn:
            conn.execute("UPDATE docs SET body = 'The battery now lasts two days.' WHERE id = 1")
            conn.execute("INSERT INTO docs VALUES (100, 'Brand new row about a quiet fan.', 4)")
            self.live_after_change = stored(conn)


def test_searches_never_fail_or_mix_and_changes_land_in_the_new_version(
    synced: registry.ModelSpec, conn: psycopg.Connection, db_url: str
) -> None:
    keys = sorted(TEXTS)
    old = dict(zip(keys, encode([TEXTS[k] for k in keys]), strict=True))
    new = dict(zip(keys, encode([TEXTS[k] for k in keys], pooling="cls"), strict=True))
    searcher = Searcher(db_url, old, new)
    searcher.start()
    try:
        reindex.begin(conn, "minilm", reindex.Change(pooling="cls"))
        changes = ChangeRowsOnce(db_url)
        runner = reindex.Reindex(db_url, "minilm", reindex.Options(claim_size=4), changes)
        switched = runner.run()
        assert switched is not None and switched.pooling == "cls"
        seen = searcher.searches
        deadline = time.monotonic() + 30
        while searcher.searches < seen + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        searcher.done.set()
        searcher.join(30)
    assert not searcher.errors, searcher.errors[0]
    assert searcher.empty == 0
    assert searcher.searches >= 5
    # Old vectors were served until the switch, new ones after it; never both at once.
    assert searcher.kinds[0] == "old" and searcher.kinds[-1] == "new"
    first_new = searcher.kinds.index("new")
    assert set(searcher.kinds[first_new:]) == {"new"}
    # While the reindex ran, the live column kept the old vector of every untouched row.
    assert all(np.allclose(changes.live_after_change[k], old[k], atol=1e-4) for k in range(2, 41))
    # Rows written during the reindex end up embedded with the new settings.
    texts = {**TEXTS, 1: "The battery now lasts two days.", 100: "Brand new row about a quiet fan."}
    assert_vectors(conn, texts, pooling="cls")
    assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)


def test_second_alter_is_refused_abort_drops_the_shadow(
    synced: registry.ModelSpec, conn: psycopg.Connection, db_url: str
) -> None:
    same = cli("--database-url", db_url, "model", "alter", "minilm", "--pooling", "mean")
    assert same.exit_code == 2 and "already has these settings" in same.output
    first = cli(
        "--database-url", db_url, "model", "alter", "minilm", "--pooling", "cls", "--no-wait"
    )
    assert first.exit_code == 0, first.output
    assert "minilm__next" in first.output and "40 rows queued" in first.output
    second = cli("--database-url", db_url, "model", "alter", "minilm", "--pooling", "max")
    assert second.exit_code == 2
    assert "already has a reindex to version 2 in progress" in second.output
    resize = cli("--database-url", db_url, "reindex", "minilm", "--m", "8")
    assert resize.exit_code == 2 and "apply when a reindex starts" in resize.output
    reserved = cli(
        "--database-url", db_url, "model", "add", "a__b", "--table", "docs", "--column", "body"
    )
    assert reserved.exit_code == 2 and "reserved" in reserved.output

    aborted = cli("--database-url", db_url, "reindex", "minilm", "--abort")
    assert aborted.exit_code == 0, aborted.output
    columns, _, triggers = objects(conn)
    assert columns == {"id", "body", "stars", "embedding_minilm"}
    assert triggers == {f"pgembed_minilm_{e}" for e in ("ins", "upd", "del", "trunc", "vec")}
    assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
    assert conn.execute("SELECT max(version) FROM pgembed.model_versions").fetchone() == (1,)
    assert_vectors(conn, TEXTS)  # the live model never changed
    nothing = cli("--database-url", db_url, "reindex", "minilm", "--abort")
    assert nothing.exit_code == 2 and "no reindex in progress" in nothing.output


def test_sync_daemons_fill_the_shadow_and_reindex_switches(
    synced: registry.ModelSpec, conn: psycopg.Connection, db_url: str
) -> None:
    alter = ["model", "alter", "minilm", "--max-seq-length", "8", "--no-wait"]
    assert cli("--database-url", db_url, *alter).exit_code == 0
    # An ordinary sync (every model) embeds the shadow too.
    stats = worker.Worker(db_url, worker.Options(once=True)).run()
    assert stats.written == 40
    (status,) = json.loads(cli("--database-url", db_url, "status", "--json").output)
    assert status["reindex"]["rows_embedded"] == 40 and not status["reindex"]["index_built"]
    done = cli("--database-url", db_url, "reindex", "minilm")
    assert done.exit_code == 0, done.output
    assert registry.get(conn, "minilm").max_seq_length == 8
    assert_vectors(conn, TEXTS, max_seq_length=8)


def test_stale_worker_releases_its_batch_instead_of_writing_old_vectors(
    synced: registry.ModelSpec, conn: psycopg.Connection, db_url: str
) -> None:
    reindex.begin(conn, "minilm", reindex.Change(pooling="cls"))
    assert reindex.Reindex(db_url, "minilm", reindex.Options()).run() is not None
    conn.execute("UPDATE docs SET body = 'Changed after the switch.' WHERE id = 2")
    # A worker that read the catalog before the switch claims, embeds with mean pooling...
    with db.connection(db_url) as wconn, pytest.raises(batch.ModelChanged):
        run_batch(wconn, synced, batch.BatchConfig("stale-worker", 64, 60, 5))
    # ...but writes nothing and gives the key back at once.
    assert 2 not in stored(conn)
    assert conn.execute("SELECT key, claimed_by FROM pgembed.queue").fetchall() == [("2", None)]
    worker.Worker(db_url, worker.Options(once=True)).run()
    texts = {**TEXTS, 2: "Changed after the switch."}
    assert_vectors(conn, texts, pooling="cls")


@pytest.fixture
def narrow_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real 128-dimension checkpoint: MiniLM with a (seeded, random) Dense projection."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize

    base = SentenceTransformer(embedder.resolve("all-MiniLM-L6-v2"), device="cpu")
    torch.manual_seed(0)
    narrow = SentenceTransformer(modules=[base[0], base[1], Dense(384, 128), Normalize()])
    path = tmp_path_factory.mktemp("narrow-minilm")
    narrow.save(str(path))
    yield path


def test_alter_to_a_checkpoint_of_other_dimensions(
    synced: registry.ModelSpec, conn: psycopg.Connection, db_url: str, narrow_checkpoint: Path
) -> None:
    result = cli(
        "--database-url", db_url, "model", "alter", "minilm", "--model", str(narrow_checkpoint)
    )
    assert result.exit_code == 0, result.output
    spec = registry.get(conn, "minilm")
    assert (spec.dimensions, spec.model_ref, spec.pooling) == (128, str(narrow_checkpoint), "mean")
    typ = conn.execute(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = 'docs'::regclass AND attname = 'embedding_minilm'"
    ).fetchone()
    assert typ == ("vector(128)",)
    got = stored(conn)
    want = embedder.get(settings_of(spec)).encode_documents([TEXTS[k] for k in sorted(TEXTS)])
    np.testing.assert_allclose(np.stack([got[k] for k in sorted(TEXTS)]), want, atol=1e-5)
    hits = planner.query(conn, spec, TEXTS[7], k=1)
    assert hits[0].key == 7
    # A caller still holding the 384-dimension spec from before the switch gets the same answer.
    assert planner.query(conn, synced, TEXTS[7], k=1) == hits
    assert cli("--database-url", db_url, "model", "fulltext", "minilm").exit_code == 0
    assert [h.key for h in search_on(conn, synced, text=TEXTS[7], hybrid=True, k=1)] == [7]


def test_index_only_rebuild_records_new_parameters(
    synced: registry.ModelSpec, conn: psycopg.Connection, db_url: str
) -> None:
    before = stored(conn)
    # A leftover of an interrupted rebuild is replaced, not a reason to fail.
    conn.execute("CREATE INDEX pgembed_minilm_next ON docs (id)")
    result = cli(
        "--database-url", db_url, "reindex", "minilm", "--index-only", "--m", "8",
        "--ef-construction", "32", "--maintenance-work-mem", "256MB", "--parallel-workers", "1",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "m=8, ef_construction=32" in result.output
    (indexdef,) = conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'pgembed_minilm_hnsw'"
    ).fetchone() or (None,)
    assert indexdef is not None and "m='8'" in indexdef and "ef_construction='32'" in indexdef
    assert ddl.index_valid(conn, "public", "pgembed_minilm_hnsw") is True
    _, indexes, _ = objects(conn)
    assert indexes == {"docs_pkey", "pgembed_minilm_hnsw"}
    spec = registry.get(conn, "minilm")
    assert (spec.hnsw_m, spec.hnsw_ef_construction, spec.version) == (8, 32, 1)
    assert conn.execute(
        "SELECT hnsw_m, hnsw_ef_construction FROM pgembed.model_versions WHERE name = 'minilm'"
    ).fetchall() == [(8, 32)]
    after = stored(conn)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert planner.query(conn, spec, TEXTS[3], k=1)[0].key == 3
    unknown = cli("--database-url", db_url, "reindex", "minilmx", "--index-only")
    assert unknown.exit_code != 0
    assert unknown.output.startswith("pgembed: error: unknown model 'minilmx'"), unknown.output


def test_index_build_reports_progress(
    synced: registry.ModelSpec, conn: psycopg.Connection, db_url: str
) -> None:
    # Enough rows that the build outlives a few polls of pg_stat_progress_create_index.
    vectors = np.random.default_rng(0).standard_normal((1500, 384)).astype(np.float32)
    with writing_vectors(conn), conn.cursor(binary=True) as cur:
        cur.executemany(
            "INSERT INTO docs (id, body, embedding_minilm) VALUES (%s, 'x', %s)",
            [(1000 + i, Vector(v)) for i, v in enumerate(vectors)],
        )
    samples: list[indexbuild.BuildProgress] = []
    spec = registry.get(conn, "minilm")
    built = indexbuild.build(
        db_url,
        spec,
        "pgembed_minilm_next",
        indexbuild.BuildSettings("64MB", 0, 0.02),
        samples.append,
    )
    assert built and samples
    assert all(0 <= s.done <= max(s.total, s.done) for s in samples)
    assert any("building index" in s.phase for s in samples)
