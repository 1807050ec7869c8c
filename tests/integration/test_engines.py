"""onnxruntime engines with the real model: built once, gated by retrieval, used everywhere."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import psycopg
import pytest

from helpers import cli
from pgembed import Client
from pgembed.encode import embedder, engines, hardware, precision
from pgembed.encode.settings import settings_of
from pgembed.errors import ModelLoadError
from pgembed.lifecycle import models
from pgembed.sync import worker

MINILM = embedder.Settings("all-MiniLM-L6-v2")
TEXTS = precision.builtin_sample()


def test_onnx_fp32_gives_torch_fp32_vectors_and_is_cached() -> None:
    onnx = embedder.get(replace(MINILM, precision="onnx-fp32"))
    assert onnx.engine == "onnx-fp32"
    got = onnx.encode_documents(TEXTS[:40])
    want = embedder.get(MINILM).encode_documents(TEXTS[:40])
    np.testing.assert_allclose(got, want, atol=2e-5)  # the same arithmetic, other kernels
    assert list(engines.cache_dir().glob("*/fused.onnx"))  # a second load reads it back


def test_gate_accepts_what_keeps_the_neighbours_and_rejects_what_does_not() -> None:
    accepted = precision.choose(MINILM, "onnx-fp32", TEXTS)
    assert accepted.precision == "onnx-fp32" and accepted.overlap == 1.0
    assert "onnx-fp32 accepted: top-10 neighbours agree with fp32's to 1.000" in accepted.note
    # torch's dynamic int8: vectors at mean cosine ~0.94 move a fifth of each top 10
    rejected = precision.choose(MINILM, "int8", TEXTS)
    assert rejected.precision == "fp32" and rejected.overlap is not None
    assert rejected.overlap < precision.MIN_OVERLAP
    assert rejected.note.startswith("int8 rejected: its vectors agree with fp32 ones only to")
    assert rejected.note.endswith("using fp32")
    # the stored figure is the real measurement, recomputed here from both models' vectors
    sample = list(dict.fromkeys(TEXTS))
    fp32 = embedder.get(MINILM).encode_documents(sample)
    int8 = embedder.get(replace(MINILM, precision="int8")).encode_documents(sample)
    assert rejected.overlap == pytest.approx(precision.neighbour_overlap(fp32, int8), abs=1e-9)


def test_per_token_int8_keeps_the_neighbours_and_ignores_the_batch() -> None:
    """onnx-int8-token passes the gate where onnx-int8 (one activation scale per batch) fails,
    and a text's vector is the same alone and among other texts."""
    accepted = precision.choose(MINILM, "onnx-int8-token", TEXTS)
    assert accepted.precision == "onnx-int8-token", accepted.note
    assert accepted.overlap is not None and accepted.overlap >= precision.MIN_OVERLAP
    per_batch = precision.choose(MINILM, "onnx-int8", TEXTS)
    assert per_batch.precision == "fp32" and per_batch.note.startswith("onnx-int8 rejected")
    texts, others = TEXTS[:24], TEXTS[100:220]

    def alone_against_among(name: str) -> float:
        model = embedder.get(replace(MINILM, precision=name))
        assert model.engine == name
        alone = np.concatenate([model.encode_documents([text]) for text in texts])
        among = model.encode_documents([*texts, *others])[: len(texts)]
        return float(np.min(np.sum(alone * among, axis=1)))

    assert alone_against_among("onnx-int8-token") >= 0.99999
    assert alone_against_among("onnx-int8") < 0.9999  # the per-batch scale moves vectors visibly


def test_without_vnni_the_weights_are_uint8_and_the_vectors_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where onnxruntime's uint8 x int8 kernel could saturate (no VNNI), the per-token graph
    stores uint8 weights instead: a file of its own, and the same vectors."""
    settings = replace(MINILM, precision="onnx-int8-token", max_seq_length=96)  # not loaded yet
    signed = embedder.get(settings).encode_documents(TEXTS[:48])
    monkeypatch.setattr(hardware, "cpu_has_vnni", lambda: False)
    unsigned = embedder.get(replace(settings, max_seq_length=95))  # another key: a new load
    assert unsigned.engine == "onnx-int8-token"
    assert list(engines.cache_dir().glob("*/onnx-int8-token-u8weights.onnx"))
    cosine = np.sum(signed * unsigned.encode_documents(TEXTS[:48]), axis=1)
    assert float(cosine.min()) > 0.99999  # 95 word pieces against 96: these texts are shorter (81)


def test_auto_takes_the_first_candidate_that_passes() -> None:
    choice = precision.choose(MINILM, "auto", TEXTS)
    order, _ = precision.auto_candidates("cpu")
    verdicts = {c: precision.agreement(MINILM, c, TEXTS).passes for c in order[:-1]}
    first = next((c for c in order[:-1] if verdicts[c]), "fp32")
    assert choice.precision == first and choice.note.startswith("auto: ")
    for skipped in order[: order.index(first)]:  # each one passed over says why
        assert f"{skipped} rejected: its vectors agree with fp32 ones only" in choice.note
    assert f"{first} accepted: top-10 neighbours agree" in choice.note


def test_an_engine_that_cannot_load_falls_back_to_torch_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "engines"
    blocked.write_text("a file where the cache directory should be")
    monkeypatch.setenv("PGEMBED_ENGINE_CACHE", str(blocked / "inside"))
    settings = replace(MINILM, precision="onnx-int8", max_seq_length=128)  # not loaded yet
    with caplog.at_level(logging.INFO, logger="pgembed.encode"):
        fallback = embedder.get(settings)
    assert fallback.engine == "fp32"
    (line,) = [r for r in caplog.records if r.name == "pgembed.encode"]
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith("engine onnx-int8 unavailable (")
    assert line.getMessage().endswith("): encoding with torch fp32")
    want = embedder.get(replace(settings, precision="fp32")).encode_documents(TEXTS[:8])
    np.testing.assert_array_equal(fallback.encode_documents(TEXTS[:8]), want)
    # the gate does not accept what would not run: the model stays fp32, and says so
    choice = precision.choose(replace(settings, precision="fp32"), "onnx-int8", TEXTS)
    assert choice.precision == "fp32"
    assert choice.note.startswith("onnx-int8 unavailable (it cannot run on this machine")


def test_an_engine_embeds_rows_queries_and_shows_in_status(
    reviews: psycopg.Connection, db_url: str
) -> None:
    request = models.AddRequest("minilm", "reviews", "body", precision="onnx-fp32")
    spec = models.add(reviews, request)[0]
    assert spec.precision == "onnx-fp32" and "onnx-fp32 accepted" in spec.precision_note
    worker.Worker(db_url, worker.Options(once=True)).run()
    rows = reviews.execute("SELECT body, embedding_minilm FROM reviews ORDER BY id").fetchall()
    encoder = embedder.get(settings_of(spec))
    assert encoder.engine == "onnx-fp32"
    want = encoder.encode_documents([body for body, _ in rows])
    np.testing.assert_allclose(np.stack([v.to_numpy() for _, v in rows]), want, atol=1e-5)
    # queries (Client, `pgembed query`, eval) go through the same settings, so the same engine
    with Client(db_url) as client:
        query = client.embed("minilm", ["battery life"], queries=True)
    np.testing.assert_allclose(query[0], encoder.encode_queries(["battery life"])[0], atol=1e-6)
    hits = cli("--database-url", db_url, "query", "battery life", "--model", "minilm", "-k", "1")
    assert hits.exit_code == 0 and "battery" in hits.output.lower()
    (status,) = json.loads(cli("--database-url", db_url, "status", "--json").output)
    assert status["precision"] == "onnx-fp32"
    assert status["engine"] == engines.describe("onnx-fp32")
    assert status["precision_note"].startswith("onnx-fp32 accepted: top-10 neighbours agree")


def test_cuda_runs_an_engine_model_with_torch_on_the_gpu() -> None:
    """On a GPU, a model whose engine was chosen on a CPU runs in torch fp32 there and agrees
    with the CPU. Without one, the same request fails in one line naming the model (torch's
    reason after it: a CPU build's, or a CUDA build's without a driver): never skipped, so a
    green run has run one of the two."""
    stored = "onnx-int8"  # a model whose engine was chosen on a CPU
    settings = replace(MINILM, device="cuda", precision=precision.on_device(stored, stored, "cuda"))
    assert settings.precision == "fp32"
    if not hardware.cuda_available():
        with pytest.raises(ModelLoadError, match=f"^cannot load model '{MINILM.model_ref}': "):
            embedder.get(settings)
        return
    gpu = embedder.get(settings)
    want = embedder.get(MINILM).encode_documents(TEXTS[:16])
    np.testing.assert_allclose(gpu.encode_documents(TEXTS[:16]), want, atol=1e-3)
