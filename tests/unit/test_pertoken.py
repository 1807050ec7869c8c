"""The per-token int8 rewrite against the arithmetic it promises, on small graphs run by
onnxruntime; the real model's graph is covered in tests/integration/test_engines.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pgembed.encode import hardware, pertoken

K, N = 24, 10


def matmul_graph(weights: np.ndarray, rank: int, opset: int = 17) -> Any:
    shape: list[int | str] = ["b", "s", K] if rank == 3 else ["rows", K]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="/layer/MatMul")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weights, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run(model: Any, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    result: np.ndarray = session.run(None, {"x": x})[0]
    return result


def per_token_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The module docstring's formula, in numpy: per-row uint8, per-column int8."""
    rows = x.reshape(-1, K).astype(np.float64)
    lo, hi = np.minimum(rows.min(axis=1), 0), np.maximum(rows.max(axis=1), 0)
    s = np.maximum((hi - lo) / 255, 1e-12)
    zp = np.round(-lo / s)
    q = np.clip(np.round(rows / s[:, None]) + zp[:, None], 0, 255)
    sw = np.abs(w).max(axis=0) / 127
    wq = np.clip(np.round(w / sw), -127, 127)
    y: np.ndarray = s[:, None] * ((q - zp[:, None]) @ wq) * sw
    return y.reshape(*x.shape[:-1], N)


# The form this CPU gets (int8 weights with VNNI), and the uint8 form that is exact everywhere:
# int8 weights on a CPU without VNNI may saturate, which is why that CPU never gets them.
@pytest.mark.parametrize(
    "signed", [hardware.cpu_has_vnni(), False], ids=["this CPU's weights", "uint8 weights"]
)
@pytest.mark.parametrize("rank", [2, 3])
def test_rewrite_computes_per_token_int8(signed: bool, rank: int) -> None:
    rng = np.random.default_rng(rank)
    w = rng.normal(size=(K, N)).astype(np.float32)
    x = rng.normal(size=(3, 5, K)).astype(np.float32)
    x[0, 1] = 0.0  # an all-zero token: scale at its floor, output exactly 0
    x[1, 2] *= 100.0  # an outlier token: it must not coarsen its neighbours
    x[2, 0] = np.abs(x[2, 0])  # one-sided: its zero point is 0
    if rank == 2:
        x = x.reshape(-1, K)
    model = pertoken.quantized(matmul_graph(w, rank), signed_weights=signed)
    assert "MatMul" not in {node.op_type for node in model.graph.node}
    got = run(model, x)
    assert got.shape == (*x.shape[:-1], N)
    np.testing.assert_allclose(got, per_token_reference(x, w), rtol=1e-4, atol=1e-5)
    assert np.all(got.reshape(-1, N)[1] == 0)  # the zero token (row 1 in either shape)
    exact = x @ w
    # a token's error is a fraction of its own scale, whatever its neighbours hold
    error = np.abs(got - exact).max(axis=-1) / np.abs(exact).max(axis=-1).clip(1e-6)
    assert float(error.max()) < 0.05


def test_a_token_is_quantized_alone() -> None:
    """A row's output does not change when other rows join it: no scale is shared."""
    rng = np.random.default_rng(7)
    w = rng.normal(size=(K, N)).astype(np.float32)
    model = pertoken.quantized(matmul_graph(w, 2), signed_weights=hardware.cpu_has_vnni())
    row = rng.normal(size=(1, K)).astype(np.float32)
    crowd = np.concatenate([row, 50 * rng.normal(size=(9, K)).astype(np.float32)])
    np.testing.assert_array_equal(run(model, row)[0], run(model, crowd)[0])


def test_graphs_it_does_not_know_are_refused() -> None:
    w = np.ones((K, N), np.float32)
    with pytest.raises(ValueError, match="opset 18"):
        pertoken.quantized(matmul_graph(w, 2, opset=18), signed_weights=True)
    no_weights = matmul_graph(w, 2)
    del no_weights.graph.initializer[:]  # MatMul of two inputs: nothing constant to quantize
    no_weights.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [K, N]))
    with pytest.raises(ValueError, match="no MatMul with constant weights"):
        pertoken.quantized(no_weights, signed_weights=True)
    attention = matmul_graph(w, 3)
    attention.graph.node.append(
        helper.make_node("Attention", ["y", "w", "b"], ["z"], domain="com.microsoft", num_heads=2)
    )
    with pytest.raises(ValueError, match="not one the rewrite knows"):  # no padding mask
        pertoken.quantized(attention, signed_weights=True)
    taken = matmul_graph(w, 2)
    taken.graph.node[0].output[0] = "pertoken_zero"
    with pytest.raises(ValueError, match="already has a tensor named 'pertoken_zero'"):
        pertoken.quantized(taken, signed_weights=True)
