"""Length-sorted batches and the overlapped (prefetch + write-behind) sync pipeline."""

from __future__ import annotations

import threading

import numpy as np
import psycopg
import pytest
import torch

from daemon_helpers import assert_every_vector_matches_its_text, fill, wait_for
from helpers import run_batch
from pgembed import db
from pgembed.catalog import registry
from pgembed.encode import batches, embedder, hardware
from pgembed.lifecycle import models
from pgembed.sync import batch, worker

MINILM = embedder.Settings("all-MiniLM-L6-v2")


def demo_texts() -> list[str]:
    from pgembed import samples

    return samples.texts()


def pad_tokens(texts: list[str], batches: list[batches.Batch]) -> int:
    """Pad positions as the model's own tokenizer pads each batch (attention mask zeros)."""
    tokenizer = embedder.get(MINILM)._model.tokenizer
    pads = 0
    for b in batches:
        encoded = tokenizer([texts[i] for i in b], padding=True, truncation=True, max_length=256)
        pads += sum(mask.count(0) for mask in encoded["attention_mask"])
    return pads


def test_token_counts_are_the_tokenizers() -> None:
    model = embedder.get(MINILM)
    texts = [*demo_texts()[:50], "", "x " * 600]
    want = [len(ids) for ids in model._model.tokenizer(texts, truncation=False)["input_ids"]]
    assert model.token_counts(texts) == want
    assert model.token_counts([]) == []


def test_sorting_by_tokens_pads_less_than_by_characters() -> None:
    texts = demo_texts()[:256]
    model = embedder.get(MINILM)
    tokens = [min(n, 256) for n in model.token_counts(texts)]
    by_tokens = batches.plan(tokens, 16)
    by_chars = batches.plan([len(t) for t in texts], 16)
    unsorted = [np.arange(i, min(i + 16, len(texts))) for i in range(0, len(texts), 16)]
    pads = {name: pad_tokens(texts, b) for name, b in [
        ("tokens", by_tokens), ("chars", by_chars), ("unsorted", unsorted)]}  # fmt: skip
    # The 256 shipped reviews (7-140 word pieces): 559 pad tokens sorted by tokens, 1407 by
    # characters, 6031 unsorted, against 7217 real ones.
    assert 2 * pads["tokens"] < pads["chars"] < pads["unsorted"] / 2
    assert pads["tokens"] / sum(tokens) < 0.1, pads


def test_sorted_encoding_returns_vectors_in_input_order() -> None:
    texts = demo_texts()[:40]
    model = embedder.get(MINILM)
    plain = model._model.encode(texts, batch_size=40, convert_to_numpy=True)
    np.testing.assert_allclose(model.encode_documents(texts, batch_size=8), plain, atol=1e-5)


def test_pipelined_worker_writes_the_same_vectors_as_the_plain_path(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    fill(reviews, 60)
    models.add(reviews, models.AddRequest("plain", "reviews", "body", precision="fp32"))
    # A local server: encodes beside a write-back run on a thread fewer (encode/sharing.py),
    # which changes no vector, and the drain gives the thread back.
    assert db.is_local(reviews)
    threads = torch.get_num_threads()
    stats = worker.Worker(db_url, worker.Options(models=("minilm",), once=True, claim_size=7)).run()
    assert stats.written == 68
    assert torch.get_num_threads() == threads
    config = batch.BatchConfig("plain-worker", claim_size=7, lease_seconds=60, max_attempts=3)
    plain_spec = registry.get(reviews, "plain")
    while run_batch(reviews, plain_spec, config) is not None:
        pass
    rows = reviews.execute("SELECT embedding_minilm, embedding_plain FROM reviews").fetchall()
    assert len(rows) == 68 and all(a is not None and b is not None for a, b in rows)
    for piped, plain in rows:
        np.testing.assert_allclose(piped.to_numpy(), plain.to_numpy(), atol=1e-5)
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)


def test_an_encode_beside_a_local_write_back_runs_on_a_thread_fewer(
    spec: registry.ModelSpec,
    reviews: psycopg.Connection,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fill(reviews, 40)
    hardware.use_all_cores()  # once per process: not a call the spy below should see
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    calls: list[int] = []
    real = torch.set_num_threads

    def spy(count: int) -> None:
        calls.append(count)
        real(count)

    monkeypatch.setattr(torch, "set_num_threads", spy)
    # Each write-back takes half a second (an application's slow trigger), so the next batch
    # encodes beside it: that encode must run on one thread, and the drain must end on two.
    reviews.execute(
        "CREATE FUNCTION slow() RETURNS trigger LANGUAGE plpgsql "
        "AS $$ BEGIN PERFORM pg_sleep(0.5); RETURN NULL; END $$"
    )
    reviews.execute(
        "CREATE TRIGGER slow AFTER UPDATE ON reviews FOR EACH STATEMENT EXECUTE FUNCTION slow()"
    )
    written: list[int] = []
    options = worker.Options(models=("minilm",), once=True, claim_size=8)
    run = worker.Worker(db_url, options).run
    sync = threading.Thread(target=lambda: written.append(run().written))
    sync.start()
    try:
        wait_for(lambda: 1 in calls, 60, "an encode on one thread beside the slow write-back")
    finally:
        sync.join()
    real(threads)
    assert written == [48]
    assert calls and calls[0] == 1 and calls[-1] == 2
    assert_every_vector_matches_its_text(reviews)


def test_text_changed_while_its_batch_is_in_flight_never_keeps_a_stale_vector(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    fill(reviews, 40)
    changed: list[str] = []

    def edit_batches_in_flight(_model: str, _rows: int) -> None:
        # Called after each write: the next batch is encoded, the one after it prefetched.
        if changed:
            return
        keys = [k for (k,) in reviews.execute(
            "SELECT key FROM pgembed.queue WHERE claimed_by IS NOT NULL")]  # fmt: skip
        for key in keys:
            reviews.execute("UPDATE reviews SET body = %s WHERE id = %s", (f"edited {key}", key))
        changed.extend(keys)

    w = worker.Worker(db_url, worker.Options(once=True, claim_size=4), edit_batches_in_flight)
    stats = w.run()
    assert len(changed) >= 4  # at least the batch being encoded while the first was written
    # The batch being encoded had read the old texts: those writes are refused. A prefetched
    # row read after its edit is written, and once more for its new queue entry.
    assert stats.skipped >= 4
    assert stats.written + stats.skipped == 48 + len(changed)
    assert_every_vector_matches_its_text(reviews)
    bodies: dict[str, str] = dict(reviews.execute("SELECT id::text, body FROM reviews").fetchall())
    assert all(bodies[k] == f"edited {k}" for k in changed)


def test_stop_finishes_the_batch_in_hand_and_releases_the_prefetched_one(
    spec: registry.ModelSpec, reviews: psycopg.Connection, db_url: str
) -> None:
    fill(reviews, 40)
    w = worker.Worker(db_url, worker.Options(once=True, claim_size=4))
    w._on_progress = lambda _model, _rows: w.stop()  # stop as soon as the first batch is written
    stats = w.run()
    # Batch 1 written, then stop: batch 2 (already encoded) is written too, batch 3 released.
    assert stats.written == 8
    assert reviews.execute("SELECT count(embedding_minilm) FROM reviews").fetchone() == (8,)
    assert reviews.execute(
        "SELECT count(*), count(*) FILTER (WHERE claimed_by IS NULL AND next_attempt_at <= now()) "
        "FROM pgembed.queue"
    ).fetchone() == (40, 40)
