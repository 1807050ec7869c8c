"""Per-model precision: what `auto` means on this machine, and whether a precision is good enough.

A precision (torch bf16/int8, or an engine of engines.py) other than fp32 is accepted for a model
only if retrieval with its vectors agrees with fp32's: on a sample of the table's own texts, each
text's 10 nearest neighbours among the others, found with the candidate's vectors, are on average
at least MIN_OVERLAP the same as those found with fp32 vectors. Otherwise the model uses fp32 and
the note says why. `choose` is the one entry point, for `model add` and `model alter` alike.

Why 0.95: it is what users see, a top 10 in which, on average, at most one neighbour in two
queries is swapped, and only among near ties; bf16 scores 0.99 and onnxruntime fp32 1.0 on every
corpus measured, every int8 recipe 0.75-0.93; the figures, with SciFact's nDCG@10 for each variant,
are in BENCHMARKS.md ("Every precision and engine tried").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache

import numpy as np
import psycopg
from psycopg import sql

from pgembed import samples
from pgembed import texts as texts_
from pgembed.encode import embedder, engines, hardware
from pgembed.encode.convert import PRECISIONS
from pgembed.encode.embedder import Settings, Vectors
from pgembed.errors import ModelLoadError, UsageError

log = logging.getLogger("pgembed.encode")

Say = Callable[[str], None]
REQUESTS = ("auto", "fp32", "bf16", "int8", *engines.VARIANTS)
KNOWN = (*PRECISIONS, *engines.VARIANTS)
MIN_OVERLAP = 0.95
NEIGHBOURS = 10
# The check's sample, bounded so that `model add` answers in seconds: 96 texts of up to ~128 word
# pieces. 256 whole IMDB reviews (MiniLM reads 256 word pieces) took 34 s to encode in fp32 alone
# on a busy 2-core machine, most of `model add`'s 65 s on 3,000 rows (issue 25); 96 texts keep
# the 80 a top 10 needs to be able to disagree (_MIN_NEIGHBOURHOOD).
SAMPLE_SIZE = 96
_MIN_NEIGHBOURHOOD = 8 * NEIGHBOURS  # fewer distinct texts: the gate adds built-in ones
# A sampled text's characters: ~128 word pieces of English (about 5 characters each).
_SAMPLE_CHARS = 5 * 128


@dataclass(frozen=True)
class Choice:
    precision: str  # what the model encodes in: fp32, bf16, fp16, int8 or an engine's
    requested: str
    cosine: float | None  # mean cosine to fp32 vectors on the sample; None: fp32, nothing to check
    note: str
    overlap: float | None = None  # mean top-10 neighbour overlap with fp32 on the sample


@dataclass(frozen=True)
class Agreement:
    """How a candidate's vectors compare with fp32 ones on the same texts."""

    overlap: float  # mean share of each text's fp32 top-10 neighbours the candidate also finds
    cosine: float  # mean cosine between the two vectors of each text
    speed: float  # the candidate's texts per second over fp32's (both models loaded before)
    texts: int

    @property
    def passes(self) -> bool:
        return self.overlap >= MIN_OVERLAP


def choose(
    settings: Settings, requested: str, texts: Sequence[str], say: Say | None = None
) -> Choice:
    """The precision a model with these settings gets (its own `precision` field is ignored).

    `settings.device` is where the check runs and what `auto` is resolved for: the first of
    `auto_candidates` that passes, the fastest first; an explicit request is that one or fp32.
    `say` is told each check as it starts (a check encodes the sample twice: seconds on a CPU).
    """
    if requested != "auto" and requested not in KNOWN:
        raise UsageError(f"invalid precision {requested!r}: use {', '.join(REQUESTS)}")
    absent = engines.missing() if engines.is_engine(requested) else None
    if absent is not None:
        raise UsageError(
            f"precision {requested} is an onnx engine, but {absent}: {engines.INSTALL}"
        )
    if requested == "auto":
        candidates, why = auto_candidates(settings.device)
    else:
        candidates, why = [requested], ""
    tried: list[str] = []
    rejected: Agreement | None = None
    for candidate in candidates:
        if candidate == "fp32":
            note = "; ".join([*tried, why or "fp32: the reference precision"])
            return Choice("fp32", requested, None, _auto(requested, note))
        if say is not None:
            say(f"checking precision {candidate} against fp32 on {_sample_size(texts)}")
        try:
            found = agreement(settings, candidate, texts)
        except ModelLoadError as exc:
            tried.append(f"{candidate} unavailable ({exc})")
            continue
        if found.passes:
            note = "; ".join([*tried, _accepted(settings, candidate, found)])
            return Choice(candidate, requested, found.cosine, _auto(requested, note), found.overlap)
        rejected = found
        tried.append(_rejected(candidate, found))
    note = "; ".join([*tried, "using fp32"])
    cosine = rejected.cosine if rejected else None
    return Choice("fp32", requested, cosine, note, rejected.overlap if rejected else None)


def _sample_size(texts: Sequence[str]) -> str:
    """`96 texts of the table`, or with the built-in sentences gate_sample adds to a few."""
    own, sample = len(dict.fromkeys(texts)), len(gate_sample(texts))
    added = f" and {sample - own} built-in sentences" if sample > own else ""
    return f"{own} texts of the table{added}"


def _auto(requested: str, note: str) -> str:
    return f"auto: {note}" if requested == "auto" else note


def _accepted(settings: Settings, candidate: str, found: Agreement) -> str:
    note = (
        f"{candidate} accepted: top-10 neighbours agree with fp32's to {found.overlap:.3f} "
        f"(>= {MIN_OVERLAP}) on {found.texts} texts, mean cosine {found.cosine:.5f}, "
        f"{found.speed:.2f}x fp32's speed in the check"
    )
    if candidate == "bf16" and settings.device == "cpu" and not hardware.cpu_has_native_bf16():
        note += (
            f"; this CPU ({hardware.cpu_capability()}) has no native bf16, so encoding here is "
            "emulated and slower than fp32"
        )
    return note


def _rejected(candidate: str, found: Agreement) -> str:
    return (
        f"{candidate} rejected: its vectors agree with fp32 ones only to top-10 overlap "
        f"{found.overlap:.3f} (< {MIN_OVERLAP}), mean cosine {found.cosine:.5f}"
    )


def auto_candidates(device: str) -> tuple[list[str], str]:
    """What `auto` tries on this device, fastest first (BENCHMARKS.md, "Every precision and
    engine tried"), and why fp32 when it comes to that."""
    if device != "cpu":
        half = gpu_half(device)
        return [half, "fp32"], f"fp32: the GPU's fastest 16-bit type, {half}, did not pass"
    bf16 = hardware.cpu_has_native_bf16()
    # Native bf16 first: 2.2x torch fp32 through this pipeline on an AMX CPU, against 1.35x
    # for onnx-int8-token, whose int8 keeps each token's activations apart, so a text's vector
    # does not depend on its batch. onnx-int8 (activations per batch) is not here: it moves more
    # of each top 10 and shifts a text's vector with its batch; nor is onnx-fp32, no faster
    # than torch fp32 (0.97x). BENCHMARKS.md, "Every precision and engine tried".
    # Without the onnx extra, the engine is left out: `auto` asks for nothing in particular.
    engine = [] if engines.missing() else ["onnx-int8-token"]
    order = [*(["bf16"] if bf16 else []), *engine, "fp32"]
    lacks = [*([] if bf16 else ["no native bf16"]), *([] if engine else ["no onnx engines"])]
    why = f"fp32: no faster precision passed on this CPU ({hardware.cpu_capability()}"
    return order, why + "".join(f", {lack}" for lack in lacks) + ")"


def on_device(stored: str, requested: str, device: str) -> str:
    """The precision an encoder of a model uses on `device` (cpu, cuda or mps).

    On a CPU: the catalog's, except fp16 (chosen on a GPU), which CPUs only emulate and which
    was accepted as agreeing with fp32. On a GPU: its 16-bit type (gpu_half) when the model asked
    for `auto` (the worker checks it once, see `checked`), an explicit bf16/fp16, else fp32; int8
    (dynamic quantization) and the onnx engines are CPU-only.
    """
    if device == "cpu":
        return "fp32" if stored == "fp16" else stored
    if requested == "auto" or stored in ("bf16", "fp16"):
        return gpu_half(device)
    return "fp32"


def gpu_half(device: str) -> str:
    """The 16-bit type a GPU encodes in: on CUDA the card's best; on an Apple GPU (mps) fp16.

    MPS has computed fp16 since its first torch release, but bf16 only with macOS 14 and a recent
    torch, and torch offers no way to ask (no is_bf16_supported for mps): fp16 runs on every Mac
    that has MPS, and is checked against fp32 like CUDA's type (`checked`)."""
    return hardware.cuda_half() if device == "cuda" else "fp16"


@cache
def checked(settings: Settings) -> Settings:
    """On a GPU, a 16-bit precision is used only if it passes the check there, on the built-in
    sample, once per process; otherwise fp32. Other settings come back unchanged."""
    if settings.device == "cpu" or settings.precision == "fp32":
        return settings
    choice = choose(settings, settings.precision, builtin_sample())
    log.info("model %s on %s: %s", settings.model_ref, settings.device, choice.note)
    return replace(settings, precision=choice.precision)


_agreements: dict[tuple[Settings, str, tuple[str, ...]], Agreement] = {}


def agreement(settings: Settings, candidate: str, texts: Sequence[str]) -> Agreement:
    """The candidate's vectors against fp32 ones for the same (distinct) texts: neighbour
    overlap, cosine, speed. Measured once per process for the same settings and texts."""
    sample = tuple(gate_sample(texts))
    key = (replace(settings, precision="fp32"), candidate, sample)
    known = _agreements.get(key)
    if known is not None:
        return known
    fp32 = embedder.get(key[0])
    other = embedder.get(replace(settings, precision=candidate))
    if other.engine != candidate:
        raise ModelLoadError("it cannot run on this machine, see the log")
    reference, fp32_seconds = _timed(fp32, list(sample))
    vectors, seconds = _timed(other, list(sample))
    found = Agreement(
        overlap=neighbour_overlap(reference, vectors),
        cosine=float(np.mean(np.sum(_unit(reference) * _unit(vectors), axis=1))),
        speed=fp32_seconds / max(seconds, 1e-9),
        texts=len(sample),
    )
    _agreements[key] = found
    return found


def gate_sample(texts: Sequence[str]) -> list[str]:
    """The distinct texts the gate compares on (duplicates tie: their order is arbitrary), with
    built-in sentences added when there are too few for a top 10 to be able to disagree."""
    sample = list(dict.fromkeys(texts))
    if len(sample) < _MIN_NEIGHBOURHOOD:
        sample = list(dict.fromkeys([*sample, *builtin_sample()]))
    return sample


def neighbour_overlap(reference: Vectors, vectors: Vectors, k: int = NEIGHBOURS) -> float:
    """Mean share of each row's k nearest other rows (cosine) under `reference` that `vectors`
    also puts in its k nearest."""
    k = min(k, len(reference) - 1)
    if k < 1:
        return 1.0
    want, got = _nearest(reference, k), _nearest(vectors, k)
    shared = [len(set(a) & set(b)) for a, b in zip(want.tolist(), got.tolist(), strict=True)]
    return float(np.mean(shared)) / k


def _nearest(vectors: Vectors, k: int) -> np.ndarray:
    unit = _unit(vectors)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)  # a text is not its own neighbour
    return np.argpartition(-similarity, k - 1, axis=1)[:, :k]


def _timed(model: embedder.Embedder, texts: list[str]) -> tuple[Vectors, float]:
    started = time.perf_counter()
    vectors = model.encode_documents(texts)
    return vectors, time.perf_counter() - started


def _unit(vectors: Vectors) -> Vectors:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit: Vectors = vectors / np.maximum(norms, 1e-12)
    return unit


def sample_texts(
    conn: psycopg.Connection,
    schema: str,
    table: str,
    text: str | sql.Composable,
    limit: int = SAMPLE_SIZE,
) -> list[str]:
    """Up to `limit` texts of the table that are not blank (gate_sample tops up a few with
    built-in sentences). `text`: a column, or the expression of the text a model embeds
    (naming.text_expression: several columns joined), so the check reads what the model will.

    Each is cut to _SAMPLE_CHARS in the database: a huge row never reaches Python whole."""
    expression = sql.Identifier(text) if isinstance(text, str) else text
    # From the first character that is not blank, as the sync worker reads a row (store.read).
    query = sql.SQL("SELECT {first} FROM {t} WHERE pgembed._has_text_v1({c}) LIMIT %s").format(
        first=texts_.first_word_sql(expression), c=expression, t=sql.Identifier(schema, table)
    )
    params = (*texts_.FIRST_WORD_PARAMS, _SAMPLE_CHARS, limit)
    return [str(row[0]) for row in conn.execute(query, params)]


def builtin_sample() -> list[str]:
    return samples.texts()[:SAMPLE_SIZE]
