"""Per-model precision: `auto` follows the CPU, a request is kept only if it agrees with fp32."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import psycopg
import pytest

from helpers import cli, run_batch
from pgembed import db
from pgembed.catalog import naming, registry
from pgembed.encode import embedder, hardware, precision
from pgembed.encode.settings import settings_of
from pgembed.errors import UsageError
from pgembed.lifecycle import models, reindex
from pgembed.sync import batch, worker
from pgembed.texts import from_first_word

MINILM = embedder.Settings("all-MiniLM-L6-v2")


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).mean())


def test_auto_tries_bf16_only_with_native_bf16() -> None:
    choice = precision.choose(MINILM, "auto", precision.builtin_sample())
    order, _ = precision.auto_candidates("cpu")  # test_engines.py checks which one it takes
    assert ("bf16" in order) == hardware.cpu_has_native_bf16()
    assert choice.precision in order and choice.requested == "auto"


def test_int8_is_rejected_with_the_measured_cosine(reviews: psycopg.Connection) -> None:
    spec = models.add(reviews, models.AddRequest("minilm", "reviews", "body", precision="int8"))[0]
    assert (spec.precision, spec.precision_requested) == ("fp32", "int8")
    assert spec.precision_cosine is not None and spec.precision_cosine < 0.999
    assert "int8 rejected" in spec.precision_note and "using fp32" in spec.precision_note
    # The stored cosine is a real measurement: recompute it from both models' vectors.
    texts = precision.gate_sample(precision.sample_texts(reviews, "public", "reviews", "body"))
    fp32 = embedder.get(MINILM).encode_documents(texts)
    int8 = embedder.get(embedder.Settings("all-MiniLM-L6-v2", precision="int8"))
    assert spec.precision_cosine == pytest.approx(
        mean_cosine(fp32, int8.encode_documents(texts)), abs=1e-6
    )
    assert f"{spec.precision_cosine:.5f}" in spec.precision_note
    stored = reviews.execute(
        "SELECT precision, precision_requested, precision_cosine, precision_note "
        "FROM pgembed.models WHERE name = 'minilm'"
    ).fetchone()
    assert stored == ("fp32", "int8", spec.precision_cosine, spec.precision_note)
    assert settings_of(spec).precision == "fp32"


def test_bf16_request_is_checked_kept_and_used_for_rows_and_queries(
    reviews: psycopg.Connection, db_url: str
) -> None:
    spec = models.add(reviews, models.AddRequest("minilm", "reviews", "body", precision="bf16"))[0]
    assert spec.precision == "bf16"
    assert spec.precision_cosine is not None and spec.precision_cosine >= 0.999
    assert "bf16 accepted: top-10 neighbours agree" in spec.precision_note
    # Accepted with a warning where bf16 is emulated: the model may run on other machines too.
    emulated = "emulated and slower than fp32" in spec.precision_note
    assert emulated == (not hardware.cpu_has_native_bf16())

    worker.Worker(db_url, worker.Options(once=True)).run()
    rows = reviews.execute("SELECT body, embedding_minilm FROM reviews ORDER BY id").fetchall()
    bf16 = embedder.get(settings_of(spec))
    assert bf16.settings.precision == "bf16"
    want = bf16.encode_documents([body for body, _ in rows])
    got = np.stack([vec.to_numpy() for _, vec in rows])
    np.testing.assert_allclose(got, want, atol=2e-3)  # bf16 sums differ a little by batch shape
    # Queries are embedded in the model's precision too.
    query = settings_of(spec)
    assert query == bf16.settings


def test_model_add_prints_and_status_shows_the_precision(
    reviews: psycopg.Connection, db_url: str
) -> None:
    added = cli(
        "--database-url", db_url, "model", "add", "minilm", "--table", "reviews", "--column",
        "body", "--precision", "int8",
    )  # fmt: skip
    assert added.exit_code == 0, added.output
    assert "precision fp32: int8 rejected: its vectors agree with fp32 ones only" in added.output
    (status,) = json.loads(cli("--database-url", db_url, "status", "--json").output)
    assert status["precision"] == "fp32" and status["precision_requested"] == "int8"
    assert 0.5 < status["precision_cosine"] < 0.999
    assert status["precision_note"].startswith("int8 rejected")
    text = cli("--database-url", db_url, "status").output
    assert "precision fp32: int8 rejected" in text


def test_bad_precision_is_a_usage_error(reviews: psycopg.Connection, db_url: str) -> None:
    result = cli(
        "--database-url", db_url, "model", "add", "m", "--table", "reviews", "--column", "body",
        "--precision", "fp64",
    )  # fmt: skip
    assert result.exit_code == 2 and "fp64" in result.output
    with pytest.raises(UsageError, match="invalid precision 'fp64'"):
        precision.choose(MINILM, "fp64", [])
    assert reviews.execute("SELECT count(*) FROM pgembed.models").fetchone() == (0,)


def test_sample_is_the_tables_texts_topped_up_when_few(reviews: psycopg.Connection) -> None:
    own = precision.sample_texts(reviews, "public", "reviews", "body")
    assert sorted(own) == sorted(r[0] for r in reviews.execute("SELECT body FROM reviews"))
    assert len(precision.sample_texts(reviews, "public", "reviews", "body", limit=3)) == 3
    reviews.execute("DELETE FROM reviews WHERE id > 2")
    reviews.execute("UPDATE reviews SET body = '  ' WHERE id = 2")
    few = precision.sample_texts(reviews, "public", "reviews", "body")
    assert few == ["The battery dies before lunch, I have to charge it twice a day."]
    assert precision.gate_sample(few) == [*few, *precision.builtin_sample()]


def test_sample_of_a_model_on_two_columns_is_the_text_it_embeds(
    reviews: psycopg.Connection, spec: registry.ModelSpec
) -> None:
    """The first column alone was sampled: a precision was checked on texts unlike the model's."""
    reviews.execute("ALTER TABLE reviews ADD COLUMN title text")
    reviews.execute("UPDATE reviews SET title = 'Title ' || id, body = NULL WHERE id = 1")
    both = replace(spec, text_columns=("title", "body"))
    texts = precision.sample_texts(reviews, "public", "reviews", naming.text_expression(both))
    joined = reviews.execute(
        "SELECT coalesce(title, '') || E'\\n' || coalesce(body, '') FROM reviews"
    ).fetchall()
    # As the worker reads them: from the first character that is not blank (a NULL title's "\n").
    assert sorted(texts) == sorted(from_first_word(text) for (text,) in joined)
    assert "Title 1\n" in texts  # a text of one column: not blank

    # `model add`'s check (precision_for) says it reads them all, not the one title; and a
    # sample topped up says how many sentences are built in, not "of the table".
    class Said(Exception):
        pass

    def say(text: str) -> None:
        raise Said(text)  # told before the check runs: no need to run it

    def told() -> str:
        with pytest.raises(Said) as said:
            models.precision_for(reviews, both, "bf16", say)
        return str(said.value)

    builtin = len(precision.gate_sample(texts)) - len(texts)  # this table is small
    for table_rows, added in [(len(joined), builtin), (1, len(precision.builtin_sample()))]:
        reviews.execute("DELETE FROM reviews WHERE id > %s", (table_rows,))
        assert told() == (
            f"checking precision bf16 against fp32 on {table_rows} texts of the table "
            f"and {added} built-in sentences"
        )
    reviews.execute(
        "INSERT INTO reviews (id, title) SELECT i, 'Title ' || i FROM generate_series(2, 200) i"
    )
    assert (
        told()
        == f"checking precision bf16 against fp32 on {precision.SAMPLE_SIZE} texts of the table"
    )


def stored_vectors(conn: psycopg.Connection) -> dict[int, np.ndarray]:
    rows = conn.execute(
        "SELECT id, embedding_minilm FROM reviews WHERE embedding_minilm IS NOT NULL"
    )
    return {key: vec.to_numpy() for key, vec in rows}


def test_alter_precision_alone_changes_the_model_in_place(
    reviews: psycopg.Connection, db_url: str
) -> None:
    """No reindex: an accepted precision agrees with fp32, so the vectors already written stay."""
    spec = models.add(reviews, models.AddRequest("minilm", "reviews", "body", precision="fp32"))[0]
    worker.Worker(db_url, worker.Options(once=True)).run()
    before = stored_vectors(reviews)
    url = ("--database-url", db_url)

    altered = cli(*url, "model", "alter", "minilm", "--precision", "bf16")
    assert altered.exit_code == 0, altered.output
    assert "model minilm: precision bf16: bf16 accepted: top-10 neighbours" in altered.output
    now = registry.get(reviews, "minilm")
    assert (now.precision, now.precision_requested, now.version) == ("bf16", "bf16", spec.version)
    assert now.precision_cosine is not None and now.precision_cosine >= 0.999
    assert registry.shadow(reviews, "minilm") is None  # nothing to reindex
    assert reviews.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
    after = stored_vectors(reviews)
    assert sorted(after) == sorted(before)
    assert all(np.array_equal(after[k], before[k]) for k in before)

    # A worker still holding the fp32 spec hands its batch back instead of writing fp32 vectors...
    reviews.execute("UPDATE reviews SET body = 'Arrived broken, refund took a month.' WHERE id = 1")
    with db.connection(db_url) as wconn, pytest.raises(batch.ModelChanged):
        run_batch(wconn, spec, batch.BatchConfig("stale", 64, 60, 5))
    # ...and a worker reading the catalog now writes bf16 ones.
    worker.Worker(db_url, worker.Options(once=True)).run()
    text = ["Arrived broken, refund took a month."]
    bf16 = embedder.get(settings_of(now)).encode_documents(text)[0]
    fp32 = embedder.get(settings_of(spec)).encode_documents(text)[0]
    # A batch of one: the same shape as here, so bf16 must match exactly, and fp32 must not.
    np.testing.assert_allclose(stored_vectors(reviews)[1], bf16, atol=1e-6)
    assert np.abs(stored_vectors(reviews)[1] - fp32).max() > 1e-4

    # A precision that does not agree falls back to fp32, says why, and status shows it.
    rejected = cli(*url, "model", "alter", "minilm", "--precision", "int8")
    assert rejected.exit_code == 0, rejected.output
    assert "model minilm: precision fp32: int8 rejected" in rejected.output
    (status,) = json.loads(cli(*url, "status", "--json").output)
    assert (status["precision"], status["precision_requested"]) == ("fp32", "int8")
    assert status["precision_note"].startswith("int8 rejected")

    # During a reindex the switch would bring the shadow's precision: refused, in one line.
    reindex.begin(reviews, "minilm", reindex.Change(pooling="cls"))
    during = cli(*url, "model", "alter", "minilm", "--precision", "bf16")
    assert during.exit_code == 2 and "reindex to version 2 in progress" in during.output
    reindex.abort(reviews, "minilm")

    bad = cli(*url, "model", "alter", "minilm", "--precision", "fp64")
    assert bad.exit_code == 2 and "fp64" in bad.output
    missing = cli(*url, "model", "alter", "nosuch", "--precision", "fp32")
    assert missing.exit_code == 1 and "nosuch" in missing.output


def test_alter_with_other_settings_checks_the_precision_for_the_new_version(
    reviews: psycopg.Connection, db_url: str
) -> None:
    models.add(reviews, models.AddRequest("minilm", "reviews", "body", precision="int8"))
    worker.Worker(db_url, worker.Options(once=True)).run()
    old = registry.get(reviews, "minilm")
    # The requested precision goes with the new version and is measured again for its settings.
    shadow, _ = reindex.begin(reviews, "minilm", reindex.Change(pooling="cls"))
    assert (shadow.precision, shadow.precision_requested) == ("fp32", "int8")
    texts = precision.sample_texts(reviews, "public", "reviews", "body")
    cls = replace(settings_of(shadow), precision="fp32")
    want = precision.agreement(cls, "int8", texts).cosine
    assert shadow.precision_cosine == pytest.approx(want, abs=1e-6)
    assert shadow.precision_cosine != old.precision_cosine
    reindex.abort(reviews, "minilm")

    result = cli(
        "--database-url", db_url, "model", "alter", "minilm", "--pooling", "cls",
        "--precision", "bf16",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "precision bf16: bf16 accepted" in result.output
    live = registry.get(reviews, "minilm")
    assert (live.pooling, live.precision, live.precision_requested) == ("cls", "bf16", "bf16")
    assert live.version == old.version + 1
    bodies: dict[int, str] = dict(reviews.execute("SELECT id, body FROM reviews").fetchall())
    want_vectors = embedder.get(settings_of(live)).encode_documents(
        [bodies[k] for k in sorted(bodies)]
    )
    got = stored_vectors(reviews)
    np.testing.assert_allclose(np.stack([got[k] for k in sorted(bodies)]), want_vectors, atol=2e-3)
