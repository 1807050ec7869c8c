"""l: every precision and engine variant on the same texts: speed, and agreement with fp32.

    python -m bench --only engines [--scifact ../shared/data/scifact]

Each variant is pgembed's own encoder (embedder.get with that precision), so what is measured is
what `sync` would run. Agreement with torch fp32: the quality gate's own numbers (top-10
neighbour overlap and mean cosine) on the benchmark's texts, and, with --scifact, nDCG@10 of
exact search over the whole SciFact corpus (300 test queries; fp32 reproduces the published
0.64508). The tried-and-dropped recipes are registered here only, for the record.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bench.env import median, timed
from pgembed.encode import embedder, engines, hardware, precision
from pgembed.search import evaluate

MINILM = embedder.Settings("all-MiniLM-L6-v2")

# Recipes measured and not kept (see BENCHMARKS.md, "Engines"): registered for this run only.
TRIED = (
    engines.Variant("onnx-int8-all", "int8 dynamic, per-channel, every MatMul", int8=True),
    engines.Variant(
        "onnx-int8-pertensor",
        "int8 dynamic, per-tensor weights, every MatMul",
        int8=True,
        per_channel=False,
    ),
)


@dataclass(frozen=True)
class Row:
    precision: str
    engine: str  # what ran (fp32 after a fallback)
    rows_per_s: float
    speedup: float  # over torch fp32, same run
    overlap: float
    cosine: float
    ndcg: float | None


def variants(include_tried: bool) -> list[str]:
    # bf16 without native support is emulated (~6x slower than fp32): no candidate, not timed
    native = ["bf16"] if hardware.cpu_has_native_bf16() else []
    names = ["fp32", *native, "int8", *engines.VARIANTS]
    if include_tried:
        for variant in TRIED:
            engines.VARIANTS.setdefault(variant.precision, variant)
            names.append(variant.precision)
    return names


def measure(
    texts: list[str], repeats: int, scifact: Path | None, include_tried: bool = True
) -> list[Row]:
    hardware.use_all_cores()
    names = variants(include_tried)
    reference = embedder.get(MINILM).encode_documents(texts)
    corpus = _scifact(scifact) if scifact else None
    rows = []
    base = 0.0
    for name in names:
        model = embedder.get(replace(MINILM, precision=name))
        speed = _speed(model, texts, repeats)
        vectors = model.encode_documents(texts)
        base = base or speed  # fp32 comes first
        cosine = float(np.mean(np.sum(reference * vectors, axis=1)))
        rows.append(
            Row(
                precision=name,
                engine=model.engine,
                rows_per_s=speed,
                speedup=speed / base,
                overlap=precision.neighbour_overlap(reference, vectors),
                cosine=cosine,
                ndcg=_ndcg(model, corpus) if corpus else None,
            )
        )
        print(rows[-1], flush=True)
    return rows


def _speed(model: embedder.Embedder, texts: list[str], repeats: int) -> float:
    model.encode_documents(texts[:64])  # warm-up
    seconds = [timed(lambda: model.encode_documents(texts)) for _ in range(repeats)]
    return len(texts) / median(seconds)


@dataclass(frozen=True)
class _Corpus:
    keys: list[str]
    documents: list[str]
    queries: dict[str, str]
    qrels: evaluate.Qrels


def _scifact(data: Path) -> _Corpus:
    keys, documents = [], []
    with gzip.open(data / "corpus.jsonl.gz", "rt", encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            keys.append(str(record["_id"]))
            documents.append(f"{record.get('title', '')} {record['text']}".strip())
    qrels = evaluate.read_qrels(data / "qrels/test.tsv")
    queries = {q: t for q, t in evaluate.read_queries(data / "queries.jsonl").items() if q in qrels}
    return _Corpus(keys, documents, queries, qrels)


def _ndcg(model: embedder.Embedder, corpus: _Corpus) -> float:
    """nDCG@10 of exact cosine search, as `pgembed eval`'s exact rows compute it."""
    documents = model.encode_documents(corpus.documents)
    ids = list(corpus.queries)
    queries = model.encode_queries([corpus.queries[q] for q in ids])
    top = np.argsort(-(queries @ documents.T), axis=1)[:, :10]
    runs = {q: [corpus.keys[i] for i in row] for q, row in zip(ids, top.tolist(), strict=True)}
    return evaluate.score(runs, corpus.qrels, 10).ndcg
