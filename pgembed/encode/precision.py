"""Per-model precision: what `auto` means on this machine, and whether a precision is good enough.

A precision other than fp32 is accepted for a model only if its vectors agree with fp32 ones:
mean cosine >= MIN_COSINE on a sample of the table's own texts. Otherwise the model uses fp32
and the note says why. `choose` is the one entry point, for `model add` and `model alter` alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache

import numpy as np
import psycopg
from psycopg import sql

from pgembed import defaults, samples
from pgembed.encode import embedder, hardware
from pgembed.encode.convert import PRECISIONS
from pgembed.encode.embedder import Settings, Vectors
from pgembed.errors import ModelLoadError, UsageError

log = logging.getLogger("pgembed.sync")

REQUESTS = ("auto", "fp32", "bf16", "int8")
MIN_COSINE = 0.999
SAMPLE_SIZE = 64
_MIN_TABLE_SAMPLE = 8  # fewer texts than this in the table: fill up with built-in sentences
# A sampled text's characters: enough for a 512-word-piece window (the encoder cuts to its own).
_SAMPLE_CHARS = defaults.CHARS_PER_WORD_PIECE * 512


@dataclass(frozen=True)
class Choice:
    precision: str  # what the model encodes in: fp32, bf16, fp16 or int8
    requested: str
    cosine: float | None  # mean cosine to fp32 vectors on the sample; None: fp32, nothing to check
    note: str


def choose(settings: Settings, requested: str, texts: Sequence[str]) -> Choice:
    """The precision a model with these settings gets (its own `precision` field is ignored).

    `settings.device` is where the check runs and what `auto` is resolved for.
    """
    if requested != "auto" and requested not in PRECISIONS:
        raise UsageError(f"invalid precision {requested!r}: use {', '.join(REQUESTS)}")
    if requested == "auto":
        candidate, reason = auto_candidate(settings.device)
    else:
        candidate, reason = requested, ""
    if candidate == "fp32":
        return Choice("fp32", requested, None, reason or "fp32: the reference precision")
    try:
        cosine, speed = agreement(settings, candidate, texts)
    except ModelLoadError as exc:
        return Choice("fp32", requested, None, f"{candidate} unavailable ({exc}): using fp32")
    if cosine < MIN_COSINE:
        return Choice(
            "fp32",
            requested,
            cosine,
            f"{candidate} rejected: its vectors agree with fp32 ones only to mean cosine "
            f"{cosine:.5f} (< {MIN_COSINE}): using fp32",
        )
    note = f"{candidate} accepted: mean cosine {cosine:.5f} to fp32 vectors"
    if candidate == "bf16" and settings.device == "cpu" and not hardware.cpu_has_native_bf16():
        note += (
            f"; this CPU ({hardware.cpu_capability()}) has no native bf16, so encoding here is "
            f"emulated and slower than fp32 (the check ran at {speed:.2f}x fp32's speed)"
        )
    return Choice(candidate, requested, cosine, note)


def auto_candidate(device: str) -> tuple[str, str]:
    """What `auto` tries on this device, and why."""
    if device == "cuda":
        half = hardware.cuda_half()
        return half, f"auto: {half}, the GPU's fastest 16-bit type"
    if hardware.cpu_has_native_bf16():
        return "bf16", "auto: bf16, which this CPU multiplies natively"
    return "fp32", f"auto: fp32, as this CPU ({hardware.cpu_capability()}) has no native bf16"


def on_device(stored: str, requested: str, device: str) -> str:
    """The precision an encoder of a model uses on `device`.

    On a CPU: the catalog's, except fp16 (chosen on a GPU), which CPUs only emulate and which
    was accepted as agreeing with fp32. On a GPU: the GPU's 16-bit type when the model asked for
    `auto` (the worker checks it once, see `verified`), an explicit bf16/fp16, else fp32; int8
    is CPU-only.
    """
    if device != "cuda":
        return "fp32" if stored == "fp16" else stored
    if requested == "auto" or stored in ("bf16", "fp16"):
        return hardware.cuda_half()
    return "fp32"


@cache
def checked(settings: Settings) -> Settings:
    """On a GPU, a 16-bit precision is used only if it passes the cosine check there, on the
    built-in sample, once per process; otherwise fp32. Other settings come back unchanged."""
    if settings.device != "cuda" or settings.precision == "fp32":
        return settings
    choice = choose(settings, settings.precision, builtin_sample())
    log.info("model %s on cuda: %s", settings.model_ref, choice.note)
    return replace(settings, precision=choice.precision)


def agreement(settings: Settings, candidate: str, texts: Sequence[str]) -> tuple[float, float]:
    """Mean cosine between the candidate precision's vectors and fp32 ones for the same texts,
    and the candidate's speed relative to fp32 on them (both models loaded before timing)."""
    sample = list(texts) or builtin_sample()
    fp32 = embedder.get(replace(settings, precision="fp32"))
    other = embedder.get(replace(settings, precision=candidate))
    reference, fp32_seconds = _timed(fp32, sample)
    vectors, seconds = _timed(other, sample)
    cosine = float(np.mean(np.sum(_unit(reference) * _unit(vectors), axis=1)))
    return cosine, fp32_seconds / max(seconds, 1e-9)


def _timed(model: embedder.Embedder, texts: list[str]) -> tuple[Vectors, float]:
    started = time.perf_counter()
    vectors = model.encode_documents(texts)
    return vectors, time.perf_counter() - started


def _unit(vectors: Vectors) -> Vectors:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: Vectors = vectors / np.maximum(norms, 1e-12)
    return unit


def sample_texts(
    conn: psycopg.Connection, schema: str, table: str, column: str, limit: int = SAMPLE_SIZE
) -> list[str]:
    """Up to `limit` non-blank texts of the table, topped up with built-in sentences if few.

    Each is cut to _SAMPLE_CHARS in the database: a huge row never reaches Python whole."""
    query = sql.SQL(
        "SELECT pg_catalog.left({c}, %s::integer) FROM {t} "
        "WHERE pg_catalog.btrim({c}) <> '' LIMIT %s"
    ).format(c=sql.Identifier(column), t=sql.Identifier(schema, table))
    texts = [str(row[0]) for row in conn.execute(query, (_SAMPLE_CHARS, limit))]
    if len(texts) < _MIN_TABLE_SAMPLE:
        texts += builtin_sample()[: limit - len(texts)]
    return texts


def builtin_sample() -> list[str]:
    return samples.texts()[:SAMPLE_SIZE]
