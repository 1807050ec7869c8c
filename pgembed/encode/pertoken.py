"""int8 with each token's activations quantized on their own: the fused graph's MatMuls rewritten.

onnxruntime's dynamic quantization scales a MatMul's whole input, every token of every text in
the batch, by one number: a text's vector then depends on its batch, and retrieval kept only
92-93 % of each top 10 on the benchmark's texts. Here each token's activations get their own
scale and zero point (uint8, asymmetric) and the weights one scale per output channel (int8), so
a token's arithmetic depends on nothing but the token. For a row x of a MatMul's input:

    s = (max(x, 0) - min(x, 0)) / 255,  zp = round(-min(x, 0) / s),  q = round(x / s) + zp
    y = s * (q @ wq * sw - zp * colsum(wq) * sw)

QuantizeLinear quantizes all rows at once (per-row scales along axis 0), MatMulIntegerToFloat
multiplies in int8 and applies the weights' scales, and the zero point's share is taken off in
float. The fused Attention ops carry their QKV projection inside; each becomes a rewritten QKV
MatMul, a Split and onnxruntime's MultiHeadAttention with the same bias and the padding mask.

The weights are int8 where the CPU has VNNI or AMX. Elsewhere onnxruntime's AVX2 kernel for
uint8 x int8 adds pairs of products in 16 bits, which can saturate at these ranges; there they
are stored as uint8 with zero point 128, which its kernels multiply exactly (the model ran 1.46x
slower so on a VNNI CPU, hence not everywhere). The integer products are exact on every CPU.

A graph the rewrite does not recognise raises ValueError: the engine is then unavailable and
the model encodes with torch fp32 (engines.load).
"""

from __future__ import annotations

from typing import Any

import numpy as np

_MS = "com.microsoft"
_LEVELS = 255.0  # uint8 activations
_WEIGHT_MAX = 127  # int8 weights, symmetric


def quantized(model: Any, signed_weights: bool) -> Any:
    """The fused fp32 ModelProto `model`, rewritten in place, returned. `signed_weights`: int8
    weights (for CPUs with VNNI or AMX), else uint8 with zero point 128."""
    from onnx import helper, numpy_helper

    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not 15 <= opset <= 17:  # Shape(start, end) needs 15; ReduceMin/Max axes attributes <= 17
        raise ValueError(f"opset {opset} is not one the per-token rewrite supports (15-17)")
    if not any(o.domain == _MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(_MS, 1))
    weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    taken = {*weights, *(name for node in graph.node for name in (*node.input, *node.output))}
    rewriter = _Rewriter(weights, taken, signed_weights)
    mask = _padding_mask(graph)
    nodes = []
    for node in graph.node:
        if node.op_type == "Attention":
            nodes += rewriter.attention(node, mask)
        elif node.op_type == "MatMul" and node.input[1] in weights:
            nodes += rewriter.matmul(node.input[0], node.input[1], node.output[0])
        else:
            nodes.append(node)
    if not rewriter.rewritten:
        raise ValueError("the graph has no MatMul with constant weights to quantize")
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(rewriter.constants)
    used = {name for node in graph.node for name in node.input}
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


def _padding_mask(graph: Any) -> tuple[str, str] | None:
    """The fused embedding layer's int32 [batch, sequence] attention mask, and the mask index it
    hands the Attention ops, if the graph has that layer."""
    for node in graph.node:
        if node.op_type == "EmbedLayerNormalization" and len(node.input) > 7 and node.input[7]:
            if len(node.output) < 2 or not node.output[1]:
                return None
            return str(node.input[7]), str(node.output[1])
    return None


class _Rewriter:
    def __init__(self, weights: dict[str, np.ndarray], taken: set[str], signed: bool) -> None:
        from onnx import numpy_helper

        self._weights = weights
        self._taken = taken  # every tensor name in the graph: new names must not meet them
        self._signed = signed
        self.rewritten = 0
        self.constants = [
            numpy_helper.from_array(np.array(value, dtype), self._name(name))
            for name, value, dtype in (
                ("zero", 0.0, np.float32),
                ("one", 1.0, np.float32),
                ("levels", _LEVELS, np.float32),
                ("eps", 1e-12, np.float32),
                ("rows", [-1], np.int64),
                ("axis1", [1], np.int64),
                ("w_zero", 128, np.uint8),
            )
        ]

    def _name(self, part: str) -> str:
        name = f"pertoken_{part}"
        if name in self._taken:
            raise ValueError(f"the graph already has a tensor named {name!r}")
        self._taken.add(name)
        return name

    def attention(self, node: Any, mask: tuple[str, str] | None) -> list[Any]:
        """A fused Attention as a rewritten QKV MatMul, a Split and MultiHeadAttention; only the
        plain BERT form is taken (no past state, the embedding layer's padding mask)."""
        from onnx import helper, numpy_helper

        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if mask is None or not (
            set(attrs) == {"num_heads"}
            and len(node.input) >= 4
            and node.input[3] == mask[1]
            and not any(node.input[4:])
            and len(node.output) == 1
        ):
            raise ValueError(f"attention node {node.name!r} is not one the rewrite knows")
        weights = self._weights.get(node.input[1])
        if weights is None or weights.ndim != 2 or weights.shape[1] % 3:
            raise ValueError(f"attention node {node.name!r} has no constant QKV weights")
        hidden = weights.shape[1] // 3
        split = self._name(f"{self.rewritten}_attention_split")
        self.constants.append(numpy_helper.from_array(np.array([hidden] * 3, np.int64), split))
        parts = ("qkv", "q", "k", "v")
        qkv, q, k, v = (self._name(f"{self.rewritten}_attention_{p}") for p in parts)
        return [
            *self.matmul(node.input[0], node.input[1], qkv),
            helper.make_node("Split", [qkv, split], [q, k, v], axis=2),
            helper.make_node(
                "MultiHeadAttention",
                [q, k, v, node.input[2], mask[0]],
                list(node.output),
                domain=_MS,
                num_heads=attrs["num_heads"],
            ),
        ]

    def matmul(self, x: str, weight: str, y: str) -> list[Any]:
        """x @ weight as int8: per-token activations, per-channel weights."""
        from onnx import TensorProto, helper, numpy_helper

        w = self._weights[weight].astype(np.float32)  # [K, N]
        if w.ndim != 2:
            raise ValueError(f"MatMul weight {weight!r} is not a matrix")
        scale = np.abs(w).max(axis=0) / _WEIGHT_MAX
        scale[scale == 0] = 1.0
        wq = np.clip(np.round(w / scale), -_WEIGHT_MAX, _WEIGHT_MAX).astype(np.int8)
        stored = wq if self._signed else (wq.astype(np.int16) + 128).astype(np.uint8)
        n = {
            part: self._name(f"{self.rewritten}_{part}")
            for part in (
                *("wq", "sw", "colsum", "rows_shape", "lead", "out_shape", "x2", "min", "max"),
                *("lo", "hi", "range", "s_raw", "s", "lo_steps", "zp_raw", "zp", "zp8", "q"),
                *("y0", "zp_col", "offset", "centred", "s_col", "y2"),
            )
        }
        self.constants += [
            numpy_helper.from_array(stored, n["wq"]),
            numpy_helper.from_array(scale.astype(np.float32), n["sw"]),
            numpy_helper.from_array((wq.sum(axis=0) * scale).astype(np.float32), n["colsum"]),
            numpy_helper.from_array(np.array([-1, w.shape[0]], np.int64), n["rows_shape"]),
        ]
        weight_zero = [] if self._signed else ["", "pertoken_w_zero"]
        self.rewritten += 1
        op = helper.make_node
        return [
            # [..., K] -> [rows, K], and back to [..., N] at the end
            op("Shape", [x], [n["lead"]], start=0, end=-1),
            op("Concat", [n["lead"], "pertoken_rows"], [n["out_shape"]], axis=0),
            op("Reshape", [x, n["rows_shape"]], [n["x2"]]),
            # each row's range, always including 0 (exactly representable)
            op("ReduceMin", [n["x2"]], [n["min"]], axes=[1], keepdims=0),
            op("ReduceMax", [n["x2"]], [n["max"]], axes=[1], keepdims=0),
            op("Min", [n["min"], "pertoken_zero"], [n["lo"]]),
            op("Max", [n["max"], "pertoken_zero"], [n["hi"]]),
            op("Sub", [n["hi"], n["lo"]], [n["range"]]),
            op("Div", [n["range"], "pertoken_levels"], [n["s_raw"]]),
            op("Max", [n["s_raw"], "pertoken_eps"], [n["s"]]),
            op("Div", [n["lo"], n["s"]], [n["lo_steps"]]),
            op("Neg", [n["lo_steps"]], [n["zp_raw"]]),
            op("Round", [n["zp_raw"]], [n["zp"]]),
            op("Cast", [n["zp"]], [n["zp8"]], to=TensorProto.UINT8),
            op("QuantizeLinear", [n["x2"], n["s"], n["zp8"]], [n["q"]], axis=0),
            op(
                "MatMulIntegerToFloat",
                [n["q"], n["wq"], "pertoken_one", n["sw"], *weight_zero],
                [n["y0"]],
                domain=_MS,
            ),
            # y = s * (y0 - zp * colsum(wq) * sw): the zero point's share, taken off in float
            op("Unsqueeze", [n["zp"], "pertoken_axis1"], [n["zp_col"]]),
            op("Mul", [n["zp_col"], n["colsum"]], [n["offset"]]),
            op("Sub", [n["y0"], n["offset"]], [n["centred"]]),
            op("Unsqueeze", [n["s"], "pertoken_axis1"], [n["s_col"]]),
            op("Mul", [n["centred"], n["s_col"]], [n["y2"]]),
            op("Reshape", [n["y2"], n["out_shape"]], [y]),
        ]
