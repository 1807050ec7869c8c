"""onnxruntime engines: a loaded model's transformer exported once to ONNX, fused, maybe int8.

An engine replaces only the transformer's forward pass. Tokenizing (padding, truncation to
max_seq_length) and the Pooling and Normalize modules stay the loaded SentenceTransformer's, so
an engine's vectors differ from torch fp32 only by its arithmetic; precision.py's gate decides
whether that difference changes retrieval. The graph is built at model-load time, once per
checkpoint and variant, into a cache directory (`cache_dir`; a one-off cost of seconds, logged);
later loads read it back. A variant that cannot be built or loaded here returns None from
`load`, with one log line, and the caller encodes with torch fp32.

onnxruntime and onnx are the `onnx` extra (`pip install 'pgembed[onnx]'`), not dependencies of
pgembed: they are imported only when an engine is built or loaded, and `missing` says when they
are not installed (precision.py then refuses a request for an engine and `auto` skips them).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import platformdirs

from pgembed.encode import hardware

log = logging.getLogger("pgembed.encode")

Vectors = npt.NDArray[np.float32]

_FORMAT = 1  # bump when the export or a variant's recipe changes: old graphs are not reused
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True)
class Variant:
    """How a graph is made from the exported fp32 one."""

    precision: str  # the catalog's name for it
    summary: str  # what status shows
    int8: bool = False  # int8 weights; activations quantized per batch unless per_token
    per_channel: bool = True  # one weight scale per output channel, not one per matrix
    keep_fp32: tuple[str, ...] = ()  # node-name parts whose MatMuls stay fp32 (the sensitive ones)
    per_token: bool = False  # int8 with activations quantized per token (pertoken.py)


VARIANTS = {
    v.precision: v
    for v in (
        Variant("onnx-fp32", "onnxruntime fp32, attention/GELU/LayerNorm fused"),
        Variant(
            "onnx-int8",
            "onnxruntime int8 (dynamic, per-channel weights), fused; each layer's FFN output "
            "projection kept fp32",
            int8=True,
            keep_fp32=("/output/dense/MatMul",),
        ),
        Variant(
            "onnx-int8-token",
            "onnxruntime int8 (per-channel weights, activations per token), every MatMul "
            "and the attention's QKV; fused attention/GELU/LayerNorm",
            int8=True,
            per_token=True,
        ),
    )
}


_PACKAGES = ("onnxruntime", "onnx")  # the `onnx` extra
INSTALL = "pip install 'pgembed[onnx]'"


def is_engine(precision: str) -> bool:
    return precision in VARIANTS


def missing() -> str | None:
    """Why no engine can run here, when their packages are not installed; else None. Found
    without importing them (onnxruntime's import alone takes 0.2-0.3 s)."""
    absent = [name for name in _PACKAGES if importlib.util.find_spec(name) is None]
    if not absent:
        return None
    return f"{' and '.join(absent)} {'is' if len(absent) == 1 else 'are'} not installed"


def describe(precision: str) -> str:
    """What computes a model's vectors at this precision, for `status`."""
    variant = VARIANTS.get(precision)
    return variant.summary if variant else f"torch {precision}"


class OnnxEncoder:
    """The transformer as an onnxruntime session between the model's own tokenizer and pooling."""

    def __init__(self, session: Any, model: Any) -> None:
        self._session = session
        self._model = model
        self._inputs = [i.name for i in session.get_inputs()]

    def encode(self, texts: list[str]) -> Vectors:
        import torch

        features = self._model.preprocess(texts)
        feed = {name: features[name].numpy() for name in self._inputs}
        features["token_embeddings"] = torch.from_numpy(self._session.run(None, feed)[0])
        with torch.inference_mode():
            for module in list(self._model)[1:]:  # Pooling [, Normalize]
                features = module(features)
        vectors: Vectors = features["sentence_embedding"].float().numpy()
        return vectors


def load(model: Any, source: str, precision: str, threads: int) -> OnnxEncoder | None:
    """The engine for `precision` on this fp32 SentenceTransformer (loaded from `source`), or
    None, said in one warning, when it cannot run here."""
    absent = missing()
    if absent is not None:  # a catalog's engine, chosen where the extra was installed
        log.warning(
            "engine %s unavailable (%s: %s): encoding with torch fp32", precision, absent, INSTALL
        )
        return None
    try:
        path = _graph(model, source, VARIANTS[precision])
        encoder = OnnxEncoder(_session(path, threads), model)
        # a graph that loads may still fail when it runs: find out now, not in the first batch
        if not np.isfinite(encoder.encode(["an example text", "a second, longer one"])).all():
            raise ValueError("the engine's first vectors are not finite")
        return encoder
    except Exception as exc:  # any failure of an optional engine: torch fp32 still works
        reason = _one_line(exc)
        log.warning("engine %s unavailable (%s): encoding with torch fp32", precision, reason)
        return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def cache_dir() -> Path:
    """$PGEMBED_ENGINE_CACHE, else the user's cache directory: a cache like Hugging Face's, kept
    across data directories (each test session, each benchmark run has its own PGEMBED_HOME)."""
    value = os.environ.get("PGEMBED_ENGINE_CACHE")
    return Path(value) if value else Path(platformdirs.user_cache_dir("pgembed")) / "engines"


def _graph(model: Any, source: str, variant: Variant) -> Path:
    """The variant's ONNX file, built now if this checkpoint has none yet."""
    if getattr(model, "default_prompt_name", None):
        raise ValueError("the checkpoint has a default prompt")
    directory = cache_dir() / _key(source)
    fused = directory / "fused.onnx"
    path = directory / f"{_file_stem(variant)}.onnx" if variant.int8 or variant.per_token else fused
    if path.exists():
        return path
    directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with _quiet():
        if not fused.exists():
            _export_fused(model, fused)
        if variant.per_token:
            _per_token(fused, path, signed_weights=hardware.cpu_has_vnni())
        elif variant.int8:
            _quantize(fused, path, variant)
    log.info(
        "engine %s built for %s in %.1f s (once per checkpoint): %s",
        variant.precision,
        source,
        time.perf_counter() - started,
        path,
    )
    return path


@contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime's optimizer and quantizer log each step (INFO, WARNING), some to the root logger:
    muted for the seconds of a build, which says what it did in one line of its own."""
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # and their Python warnings (deprecations, tracing)
            yield
    finally:
        logging.disable(logging.NOTSET)


def _key(source: str) -> str:
    """The checkpoint's files (by size and mtime) and the versions that shape the graph."""
    root = Path(source)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    parts = [source, str(_FORMAT), *(_version(p) for p in ("torch", "onnxruntime", "onnx"))]
    parts += [f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def _export_fused(model: Any, target: Path) -> None:
    """torch.onnx export of the transformer (eager attention, which onnxruntime's BERT optimizer
    recognises), then its fusions: Attention, BiasGelu, SkipLayerNormalization."""
    raw = target.with_suffix(".raw.onnx")
    _export(model, raw)
    from onnxruntime.transformers import optimizer

    config_ = _transformer(model).config
    optimized = optimizer.optimize_model(
        str(raw),
        model_type="bert",
        num_heads=int(config_.num_attention_heads),
        hidden_size=int(config_.hidden_size),
        opt_level=1,
        use_gpu=False,
    )
    _atomic(target, lambda tmp: optimized.save_model_to_file(str(tmp)))
    raw.unlink()


def _transformer(model: Any) -> Any:
    first = model[0]
    return getattr(first, "model", None) or first.auto_model


def _export(model: Any, target: Path) -> None:
    import torch

    bert = _transformer(model)
    before = bert.config._attn_implementation
    sample = model.preprocess(["an example text", "a second, longer example text"])
    args = tuple(sample[name] for name in _INPUTS)

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: Any, mask: Any, types: Any) -> Any:
            out = self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types)
            return out.last_hidden_state

    axes = {name: {0: "batch", 1: "sequence"} for name in (*_INPUTS, "last_hidden_state")}
    bert.set_attn_implementation("eager")
    try:
        with torch.no_grad():  # (its tracer's warnings are muted by _quiet)
            _atomic(
                target,
                lambda tmp: torch.onnx.export(
                    Hidden().eval(),
                    args,
                    str(tmp),
                    input_names=list(_INPUTS),
                    output_names=["last_hidden_state"],
                    dynamic_axes=axes,
                    opset_version=17,
                    dynamo=False,
                ),
            )
    finally:
        bert.set_attn_implementation(before)


def _quantize(fused: Path, target: Path, variant: Variant) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(fused), load_external_data=False).graph
    kept = [n.name for n in graph.node if any(part in n.name for part in variant.keep_fp32)]
    _atomic(
        target,
        lambda tmp: quantize_dynamic(
            str(fused),
            str(tmp),
            per_channel=variant.per_channel,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=kept,
            # the fused ops are in onnxruntime's domain, which ONNX shape inference skips
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        ),
    )


def _file_stem(variant: Variant) -> str:
    """A per-token graph's weights are int8 only where the CPU has VNNI (pertoken.py): the two
    forms are different files, so a cache shared by different CPUs holds both."""
    if variant.per_token and not hardware.cpu_has_vnni():
        return f"{variant.precision}-u8weights"
    return variant.precision


def _per_token(fused: Path, target: Path, signed_weights: bool) -> None:
    import onnx

    from pgembed.encode import pertoken

    model = pertoken.quantized(onnx.load(str(fused)), signed_weights)
    _atomic(target, lambda tmp: onnx.save(model, str(tmp)))


def _atomic(target: Path, write: Any) -> None:
    """Write through a private temporary name, then rename: a concurrent loader never reads half
    a file, and two processes building the same graph both end with a whole one."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def _session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only: no notes on every load
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
