"""A light query encoder: a BERT checkpoint's forward pass in plain torch ops.

Importing sentence-transformers (transformers, scikit-learn, scipy on top of torch) takes
seconds, and a cold `pgembed query` needs one vector; `pgembed serve` encodes one query per
request, where sentence-transformers' own per-call work costs a few milliseconds. For the
checkpoints this module can
reproduce, it computes that vector with torch alone and the `tokenizers` library, from the
checkpoint's own files, op for op as transformers' BertModel and sentence-transformers' Pooling
and Normalize do (same kernels, same order, same dtype: fp32, bf16 or fp16 as the model's
precision says). Reproducible means: a BERT encoder with float32 safetensors weights and sdpa
attention, a BertTokenizer whose tokenizer_config.json settings match tokenizer.json's, read by
sentence-transformers as Transformer -> Pooling (mean, cls or max) [-> Normalize], without a
default prompt or lower-casing of its own. tests/integration/test_light_encoder.py compares the
vectors with the sentence-transformers path's. `load` returns None for anything else (int8,
other architectures), and the caller loads the model with sentence-transformers as usual.

A single text runs alone (no padding, so no attention mask): the very vectors. A batch of queries
(`pgembed serve`'s dynamic batching, search/batching.py) runs as one padded forward pass with an
attention mask, as sentence-transformers runs any batch: each vector equals its single-text one to
float rounding (cosine > 0.99999; tests/integration/test_light_encoder.py), several times faster
per text than one text at a time. Meant for queries, not bulk work.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pgembed.catalog import registry

log = logging.getLogger("pgembed.encode")

Array = npt.NDArray[np.float32]

_TRANSFORMER, _POOLING, _NORMALIZE = "Transformer", "Pooling", "Normalize"
_LEGACY_POOLING = {  # sentence-transformers' legacy flags, in its order of precedence
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_PRECISIONS = ("fp32", "bf16", "fp16")  # int8 (quantized Linear layers) is not reproduced here
_SENTENCE_BERT_KEYS = {"max_seq_length", "do_lower_case"}
_TOKENIZER_CLASSES = (None, "BertTokenizer", "BertTokenizerFast")


# Word pieces (texts x the longest) one padded forward pass of a query batch holds at most.
BATCH_TOKENS = 4096


class Unsupported(Exception):
    """This checkpoint or these settings are not ones this module reproduces."""


@dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    hidden: int
    eps: float
    positions: int


class LightModel:
    """One loaded checkpoint: its tokenizer, weights (in the model's precision) and pooling."""

    def __init__(
        self,
        weights: Mapping[str, Any],
        shape: Shape,
        tokenizer: Any,
        counter: Any,
        pooling: str,
        max_seq_length: int,
        normalize: bool,
    ) -> None:
        self._w = weights
        self._shape = shape
        self._tokenizer = tokenizer
        self._counter = counter
        self.pooling = pooling
        self.max_seq_length = max_seq_length
        self.normalize = normalize
        self.dimensions = shape.hidden
        self.position_limit = shape.positions

    def encode(self, texts: list[str]) -> Array:
        """One vector per text: alone when one, else in one padded batch (sorted by length, in
        parts of at most BATCH_TOKENS word pieces, so a long text pads no short one much)."""
        import torch

        out = np.empty((len(texts), self.dimensions), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(texts)
        with torch.inference_mode():
            if len(texts) == 1:
                ids = torch.tensor([encodings[0].ids], dtype=torch.long)
                out[0] = self._pool(self._forward(ids)).float().numpy()[0]
                return out
            order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
            start = 0
            while start < len(order):
                end = start + 1
                while end < len(order) and len(encodings[order[end]].ids) * (end + 1 - start) <= (
                    BATCH_TOKENS
                ):
                    end += 1
                part = order[start:end]
                out[part] = self._padded([encodings[i].ids for i in part])
                start = end
        return out

    def _padded(self, sequences: list[list[int]]) -> Array:
        import torch

        longest = max(len(ids) for ids in sequences)
        ids = torch.zeros((len(sequences), longest), dtype=torch.long)
        mask = torch.zeros((len(sequences), longest), dtype=torch.bool)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            mask[row, : len(sequence)] = True
        vectors: Array = self._pool(self._forward(ids, mask), mask).float().numpy()
        return vectors

    def count(self, texts: list[str]) -> list[int]:
        """Word pieces each text has untruncated, special tokens included."""
        return [len(e) for e in self._counter.encode_batch(texts)] if texts else []

    def _forward(self, ids: Any, mask: Any = None) -> Any:
        """BertModel's last hidden state for one unpadded sequence (token type 0 throughout),
        op for op as transformers computes it (sdpa attention); or for a padded batch, whose
        `mask` (batch x tokens, True for a real token) keeps padding out of attention."""
        import torch
        from torch.nn import functional as F

        w, s = self._w, self._shape
        b, n = ids.shape
        attend = None if mask is None else mask[:, None, None, :]
        size = s.hidden // s.heads
        x = F.embedding(ids, w["embeddings.word_embeddings.weight"])
        x = x + F.embedding(torch.zeros_like(ids), w["embeddings.token_type_embeddings.weight"])
        x = x + F.embedding(
            torch.arange(n).unsqueeze(0), w["embeddings.position_embeddings.weight"]
        )
        x = self._norm(x, "embeddings.LayerNorm")
        for i in range(s.layers):
            p = f"encoder.layer.{i}."
            q, k, v = (
                self._linear(x, f"{p}attention.self.{name}").view(b, n, -1, size).transpose(1, 2)
                for name in ("query", "key", "value")
            )
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=attend, scale=size**-0.5)
            context = context.transpose(1, 2).contiguous().reshape(b, n, -1).contiguous()
            x = self._norm(
                self._linear(context, f"{p}attention.output.dense") + x,
                f"{p}attention.output.LayerNorm",
            )
            inner = F.gelu(self._linear(x, f"{p}intermediate.dense"))
            x = self._norm(self._linear(inner, f"{p}output.dense") + x, f"{p}output.LayerNorm")
        return x

    def _pool(self, tokens: Any, real: Any = None) -> Any:
        """sentence-transformers' Pooling and Normalize; `real` (batch x tokens) marks the tokens
        that are not padding (None: all count)."""
        import torch
        from torch.nn import functional as F

        if real is None:
            real = torch.ones(tokens.shape[:-1], dtype=torch.bool)
        if self.pooling == "cls":
            vector = tokens[:, 0]
        elif self.pooling == "max":
            vector = tokens.masked_fill(~real.unsqueeze(-1), -1e9).max(dim=1).values
        else:
            half = tokens.dtype in (torch.float16, torch.bfloat16)
            accumulate = torch.float32 if half else tokens.dtype
            mask = real.to(torch.int64).unsqueeze(-1).to(tokens.dtype)
            total = (tokens * mask).sum(dim=1, dtype=accumulate)
            count = torch.clamp(mask.sum(dim=1, dtype=accumulate), min=1e-9)
            vector = (total / count).to(tokens.dtype)
        return F.normalize(vector, p=2, dim=-1) if self.normalize else vector

    def _linear(self, x: Any, name: str) -> Any:
        from torch.nn import functional as F

        return F.linear(x, self._w[f"{name}.weight"], self._w[f"{name}.bias"])

    def _norm(self, x: Any, name: str) -> Any:
        from torch.nn import functional as F

        weight = self._w[f"{name}.weight"]
        return F.layer_norm(x, weight.shape, weight, self._w[f"{name}.bias"], self._shape.eps)


def load(
    directory: Path,
    pooling: str | None,
    max_seq_length: int | None,
    normalize: bool,
    precision: str = "fp32",
) -> LightModel | None:
    """The checkpoint in `directory` with these settings, or None when this module cannot
    reproduce the sentence-transformers path for it (the reason is logged at DEBUG)."""
    try:
        return _load(directory, pooling, max_seq_length, normalize, precision)
    except (Unsupported, OSError, ValueError, KeyError, TypeError) as exc:
        log.debug("no light encoder for %s: %s", directory, exc)
        return None


def _load(
    directory: Path,
    pooling: str | None,
    max_seq_length: int | None,
    normalize: bool,
    precision: str,
) -> LightModel:
    if precision not in _PRECISIONS:
        raise Unsupported(f"precision {precision}")
    pooling_dir = _modules(directory)
    bert = _json(directory / "sentence_bert_config.json")
    if set(bert) - _SENTENCE_BERT_KEYS or bert.get("do_lower_case"):
        raise Unsupported(f"sentence_bert_config.json asks for more: {sorted(bert)}")
    prompts = _json(directory / "config_sentence_transformers.json", missing_ok=True)
    if prompts.get("default_prompt_name"):
        raise Unsupported("the checkpoint has a default prompt")
    config = _json(directory / "config.json")
    shape = _shape(config)
    mode = pooling or _pooling_of(_json(pooling_dir / "config.json"))
    if mode not in registry.POOLINGS:
        raise Unsupported(f"pooling {mode!r}")
    length = max_seq_length or bert.get("max_seq_length")  # None: the tokenizer's, not read here
    if not isinstance(length, int) or not 0 < length <= shape.positions:
        raise Unsupported(f"max_seq_length {length!r}")

    _require_tokenizer(directory)

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=length)
    counter = Tokenizer.from_file(str(directory / "tokenizer.json"))
    counter.no_padding()
    counter.no_truncation()
    weights = _weights(directory / "model.safetensors", shape, precision)
    return LightModel(weights, shape, tokenizer, counter, mode, length, normalize)


def _json(path: Path, *, missing_ok: bool = False) -> dict[str, Any]:
    if missing_ok and not path.exists():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise Unsupported(f"{path.name} is not a JSON object")
    return value


def _modules(directory: Path) -> Path:
    """Checks modules.json is Transformer (at the root) -> Pooling [-> Normalize]; the Pooling's
    directory."""
    path = directory / "modules.json"
    modules = json.loads(path.read_text(encoding="utf-8"))
    kinds = [str(m.get("type", "")).rpartition(".")[2] for m in modules]
    if kinds not in ([_TRANSFORMER, _POOLING], [_TRANSFORMER, _POOLING, _NORMALIZE]):
        raise Unsupported(f"modules {kinds}")
    if not all(str(m["type"]).startswith("sentence_transformers.") for m in modules):
        raise Unsupported("modules from outside sentence-transformers")
    if modules[0].get("path", "") not in ("", "."):
        raise Unsupported("the Transformer module is not at the checkpoint's root")
    return directory / str(modules[1]["path"])


def _shape(config: Mapping[str, Any]) -> Shape:
    checks = {
        "model_type": config.get("model_type") == "bert",
        "hidden_act": config.get("hidden_act") == "gelu",
        "position_embedding_type": config.get("position_embedding_type", "absolute") == "absolute",
        "is_decoder": not config.get("is_decoder", False),
        "add_cross_attention": not config.get("add_cross_attention", False),
        # transformers' default, which _forward reproduces (eager attention differs in rounding)
        "attn_implementation": all(
            config.get(key) in (None, "sdpa")
            for key in ("attn_implementation", "_attn_implementation")
        ),
        # dtype="auto" would load the weights in this dtype; _weights checks theirs
        "dtype": all(config.get(key) in (None, "float32") for key in ("dtype", "torch_dtype")),
    }
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        raise Unsupported(f"config.json: {', '.join(failed)}")
    shape = Shape(
        layers=int(config["num_hidden_layers"]),
        heads=int(config["num_attention_heads"]),
        hidden=int(config["hidden_size"]),
        eps=float(config.get("layer_norm_eps", 1e-12)),
        positions=int(config["max_position_embeddings"]),
    )
    if shape.hidden % shape.heads:
        raise Unsupported("hidden_size is not a multiple of num_attention_heads")
    return shape


def _require_tokenizer(directory: Path) -> None:
    """Checks tokenizer.json normalizes text as transformers' BertTokenizer will: transformers
    rebuilds the normalizer from tokenizer_config.json's settings (or their defaults), not from
    tokenizer.json's, and this module reads only tokenizer.json."""
    settings = _json(directory / "tokenizer_config.json", missing_ok=True)
    if settings.get("tokenizer_class") not in _TOKENIZER_CLASSES:
        raise Unsupported(f"tokenizer_class {settings.get('tokenizer_class')!r}")
    lowercase = settings.get("do_lower_case", True)
    want = {
        "clean_text": True,
        "lowercase": lowercase,
        "strip_accents": _strips_accents(settings.get("strip_accents"), lowercase),
        "handle_chinese_chars": settings.get("tokenize_chinese_chars", True),
    }
    normalizer = _json(directory / "tokenizer.json").get("normalizer")
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        raise Unsupported("tokenizer.json's normalizer is not a BertNormalizer")
    have = {
        "clean_text": normalizer.get("clean_text", True),
        "lowercase": normalizer.get("lowercase", True),
        "strip_accents": _strips_accents(
            normalizer.get("strip_accents"), normalizer.get("lowercase", True)
        ),
        "handle_chinese_chars": normalizer.get("handle_chinese_chars", True),
    }
    differ = [key for key in want if want[key] is not have[key]]
    if differ:
        raise Unsupported(f"tokenizer.json and tokenizer_config.json differ on {differ}")


def _strips_accents(strip_accents: Any, lowercase: Any) -> Any:
    """BertNormalizer's rule: no strip_accents setting means strip them when lower-casing."""
    return lowercase if strip_accents is None else strip_accents


def _pooling_of(config: Mapping[str, Any]) -> str:
    """The mode sentence-transformers reads from a Pooling config (new or legacy keys)."""
    mode = config.get("pooling_mode")
    if mode is None:
        active = [m for key, m in _LEGACY_POOLING.items() if config.get(key, False)]
        mode = active[0] if len(active) == 1 else ("mean" if not active else tuple(active))
    if isinstance(mode, list | tuple):
        mode = mode[0] if len(mode) == 1 else None
    if not isinstance(mode, str):
        raise Unsupported(f"pooling config {dict(config)}")
    return mode


def _weights(path: Path, shape: Shape, precision: str) -> dict[str, Any]:
    """The checkpoint's tensors without a `bert.` prefix, in the model's precision (as
    `model.to(dtype)` converts every floating-point parameter)."""
    import torch
    from safetensors.torch import load_file

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    stored = load_file(str(path))
    # transformers loads with dtype="auto": a half-precision checkpoint would run in its dtype
    halves = {str(t.dtype) for t in stored.values() if t.is_floating_point()} - {"torch.float32"}
    if halves:
        raise Unsupported(f"weights stored as {sorted(halves)}, not float32")
    tensors = {
        name.removeprefix("bert."): tensor.to(dtype) if tensor.is_floating_point() else tensor
        for name, tensor in stored.items()
    }
    _require_weights(tensors, shape)
    return tensors


def _require_weights(tensors: Mapping[str, Any], shape: Shape) -> None:
    names = [
        f"embeddings.{e}.weight"
        for e in ("word_embeddings", "position_embeddings", "token_type_embeddings")
    ]
    layer = [
        "attention.self.query",
        "attention.self.key",
        "attention.self.value",
        "attention.output.dense",
        "attention.output.LayerNorm",
        "intermediate.dense",
        "output.dense",
        "output.LayerNorm",
    ]
    names += [
        f"{prefix}.{part}"
        for prefix in ["embeddings.LayerNorm"]
        + [f"encoder.layer.{i}.{m}" for i in range(shape.layers) for m in layer]
        for part in ("weight", "bias")
    ]
    missing = [n for n in names if n not in tensors]
    if missing:
        raise Unsupported(f"no tensor {missing[0]} (and {len(missing) - 1} more)")
    if tensors["embeddings.word_embeddings.weight"].shape[1] != shape.hidden:
        raise Unsupported("embedding width differs from hidden_size")
