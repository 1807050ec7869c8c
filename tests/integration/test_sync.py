from __future__ import annotations

import numpy as np
import psycopg
import pytest

from helpers import REVIEWS, cli
from pgembed import Client
from pgembed.catalog import registry
from pgembed.encode import embedder, hardware
from pgembed.encode.settings import runtime_settings
from pgembed.sync import store, worker


def vectors(conn: psycopg.Connection) -> dict[int, np.ndarray | None]:
    rows = conn.execute("SELECT id, embedding_minilm FROM reviews").fetchall()
    return {key: None if v is None else v.to_numpy() for key, v in rows}


def expected(texts: list[str]) -> np.ndarray:
    return embedder.get(embedder.Settings("all-MiniLM-L6-v2")).encode_documents(texts)


def test_sync_once_embeds_every_row_with_the_models_vector(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    result = cli("--database-url", db_url, "sync", "--once", "--claim-size", "3")
    assert result.exit_code == 0, result.output
    assert "8 written" in result.output
    got = vectors(reviews)
    want = expected([text for _, text in REVIEWS])
    for (key, _), vec in zip(REVIEWS, want, strict=True):
        np.testing.assert_allclose(got[key], vec, atol=1e-5)  # type: ignore[arg-type]  # None fails
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)


def test_vector_is_not_written_when_text_changed_during_embedding(
    spec: registry.ModelSpec, reviews: psycopg.Connection
) -> None:
    claims = store.claim(reviews, "minilm", "w1", 10, 60)
    rows = store.read(reviews, spec, [c.key for c in claims])
    vecs = expected([r.text for r in rows])
    # The application changes a row while its batch is being embedded.
    reviews.execute("UPDATE reviews SET body = 'rewritten while in flight' WHERE id = 3")
    written = store.write(reviews, spec, [r.key for r in rows], [r.text_md5 for r in rows], vecs)
    store.complete(reviews, "minilm", claims)
    assert "3" not in written and len(written) == 7
    assert vectors(reviews)[3] is None
    # The changed row is still queued (with a new seq) and the next sync embeds its new text.
    assert reviews.execute("SELECT key FROM pgembed.queue").fetchall() == [("3",)]


def test_in_flight_update_ends_with_the_new_texts_vector(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    claims = store.claim(reviews, "minilm", "w1", 10, 60)
    reviews.execute("UPDATE reviews SET body = 'rewritten while in flight' WHERE id = 3")
    rows = store.read(reviews, spec, [c.key for c in claims])  # already sees the new text...
    reviews.execute("UPDATE reviews SET body = 'and rewritten again' WHERE id = 3")  # ...then this
    written = store.write(
        reviews,
        spec,
        [r.key for r in rows],
        [r.text_md5 for r in rows],
        expected([r.text for r in rows]),
    )
    store.complete(reviews, "minilm", claims)
    assert "3" not in written
    worker.Worker(db_url, worker.Options(once=True)).run()
    np.testing.assert_allclose(vectors(reviews)[3], expected(["and rewritten again"])[0], atol=1e-5)  # type: ignore[arg-type]  # None fails


def test_blank_text_gets_no_vector_and_leaves_the_queue(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    # Enqueue rows whose text is blank by hand (e.g. emptied after being queued).
    reviews.execute("INSERT INTO reviews VALUES (50, 'x', 1)")
    reviews.execute("ALTER TABLE reviews DISABLE TRIGGER USER")
    reviews.execute("UPDATE reviews SET body = '' WHERE id = 50")
    reviews.execute("ALTER TABLE reviews ENABLE TRIGGER USER")
    stats = worker.Worker(db_url, worker.Options(once=True)).run()
    assert stats.written == 8 and stats.skipped == 1
    assert vectors(reviews)[50] is None
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)


def test_long_text_is_truncated_and_counted(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    long_text = "The battery life is disappointing. " * 120
    reviews.execute("INSERT INTO reviews VALUES (60, %s, 1), (61, %s, 1)", (long_text, long_text))
    worker.Worker(db_url, worker.Options(once=True)).run()
    result = cli("--database-url", db_url, "status", "--json")
    import json

    (status,) = json.loads(result.output)
    assert status["truncated"] == 2
    assert status["rows_embedded"] == status["rows_total"] == 10
    # Shortening the text clears the mark once it is embedded again.
    reviews.execute("UPDATE reviews SET body = 'short now' WHERE id = 60")
    worker.Worker(db_url, worker.Options(once=True)).run()
    assert reviews.execute("SELECT count(*) FROM pgembed.truncated").fetchone() == (1,)
    # A text made blank has nothing left to cut or to fail on: its mark and any failure record
    # (here one left from an earlier text) go at once, with its vector.
    reviews.execute(
        "INSERT INTO pgembed.failures (model, key, attempts, error) VALUES ('minilm', '61', 5, 'x')"
    )
    reviews.execute("UPDATE reviews SET body = '   ' WHERE id = 61")
    assert reviews.execute("SELECT count(*) FROM pgembed.truncated").fetchone() == (0,)
    assert reviews.execute("SELECT count(*) FROM pgembed.failures").fetchone() == (0,)


def test_a_text_led_by_pages_of_white_space_is_read_from_its_first_word(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    # 15,000 blank characters, more than the 8,192 a row is read to: they were read alone, and
    # the row embedded as an empty text.
    words = "A gripping thriller with a twist I never saw coming."
    blanks = "\n \t\u00a0\u200b\u3000" * 2500
    reviews.execute("INSERT INTO reviews VALUES (70, %s, 1)", (blanks + words,))
    worker.Worker(db_url, worker.Options(once=True)).run()
    np.testing.assert_allclose(vectors(reviews)[70], expected([words])[0], atol=1e-5)  # type: ignore[arg-type]  # None fails
    assert reviews.execute("SELECT count(*) FROM pgembed.truncated").fetchone() == (0,)
    # The row's own text, given as a query or to embed, is read alike: it was cut to its blanks.
    with Client(db_url) as client:
        np.testing.assert_allclose(
            client.embed("minilm", [blanks + words])[0], expected([words])[0], atol=1e-5
        )
        hits = client.search("minilm", blanks[:9000] + words, k=1)  # queries: 10,000 at most
    assert hits[0].key == 70 and hits[0].similarity > 0.999


def test_status_reports_progress(spec: registry.ModelSpec, db_url: str) -> None:
    import json

    before = json.loads(cli("--database-url", db_url, "status", "--json").output)[0]
    assert before["queued"] == 8 and before["rows_embedded"] == 0
    assert before["oldest_queued_seconds"] >= 0
    keys = {
        "name",
        "table",
        "column",
        "model",
        "pooling",
        "dimensions",
        "rows_total",
        "rows_embedded",
        "queued",
        "oldest_queued_seconds",
    }
    assert keys <= before.keys()
    worker.Worker(db_url, worker.Options(once=True)).run()
    after = json.loads(cli("--database-url", db_url, "status", "--json").output)[0]
    assert after["queued"] == 0 and after["rows_embedded"] == 8
    assert after["oldest_queued_seconds"] is None


def test_sync_once_with_nothing_queued_loads_no_model(
    spec: registry.ModelSpec,
    reviews: psycopg.Connection,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A `sync --once` from cron or CI with nothing queued loads no model (seconds of CPU).

    The observable is the process's cache of loaded models (embedder.get's): the model's entry,
    taken out for this test (monkeypatch puts it back after), is not there again after an idle
    `sync --once`; one queued row brings it back, so the cache does show a load."""
    assert "8 written" in cli("--database-url", db_url, "sync", "--once").output
    loaded = runtime_settings(spec, hardware.resolve_device("auto"))
    assert loaded in embedder._cache  # the entry the sync's load made: the one it would make
    monkeypatch.delitem(embedder._cache, loaded)
    idle = cli("--database-url", db_url, "sync", "--once")
    assert idle.exit_code == 0, idle.output
    assert idle.stdout == "synced: 0 written, 0 skipped, 0 failed\n"
    assert loaded not in embedder._cache
    reviews.execute("UPDATE reviews SET body = 'Crisp apples, sweet and juicy.' WHERE id = 3")
    busy = cli("--database-url", db_url, "sync", "--once")
    assert "1 written" in busy.output, busy.output
    assert loaded in embedder._cache
