"""The quality gate's measure and what `auto` tries, without a model."""

from __future__ import annotations

import numpy as np

from pgembed.encode import engines, hardware, precision


def test_neighbour_overlap_counts_shared_top_k() -> None:
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(200, 16)).astype(np.float32)
    assert precision.neighbour_overlap(reference, reference) == 1.0
    assert precision.neighbour_overlap(reference, reference * 3) == 1.0  # cosine: scale-free
    slightly = reference + rng.normal(scale=0.01, size=reference.shape).astype(np.float32)
    assert precision.neighbour_overlap(reference, slightly) > 0.95
    unrelated = rng.normal(size=reference.shape).astype(np.float32)
    assert precision.neighbour_overlap(reference, unrelated) < 0.2  # chance: 10/199


def test_neighbour_overlap_of_tiny_samples() -> None:
    one = np.ones((1, 4), dtype=np.float32)
    assert precision.neighbour_overlap(one, one) == 1.0  # no neighbour to disagree on
    line = np.array([[1, 0], [1, 0.1], [1, 0.3], [1, 0.6]], dtype=np.float32)
    # k = 3 of 3 others: every candidate agrees, which is why the gate tops a sample up
    assert precision.neighbour_overlap(line, line[::-1]) == 1.0
    assert precision.neighbour_overlap(line, line[::-1], k=1) == 0.5


def test_auto_tries_the_fastest_first_and_ends_with_fp32() -> None:
    order, why = precision.auto_candidates("cpu")
    assert order[0] == ("bf16" if hardware.cpu_has_native_bf16() else "onnx-int8-token")
    assert order[-2:] == ["onnx-int8-token", "fp32"]
    assert "onnx-int8" not in order  # activations per batch: a text's vector moves with its batch
    assert ("bf16" in order) == hardware.cpu_has_native_bf16()
    assert "onnx-fp32" not in order  # no faster than torch fp32: requestable, not tried
    assert hardware.cpu_capability() in why


def test_engines_are_requestable_and_cpu_only() -> None:
    assert set(engines.VARIANTS) <= set(precision.REQUESTS)
    for name in engines.VARIANTS:
        assert precision.on_device(name, name, "cpu") == name
        assert precision.on_device(name, name, "cuda") == "fp32"  # torch on a GPU
        assert engines.describe(name).startswith("onnxruntime")
    assert engines.describe("bf16") == "torch bf16"
    assert not engines.is_engine("int8")
