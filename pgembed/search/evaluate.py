"""How good is a model's search? BEIR-style queries and qrels scored by nDCG, recall and MRR.

Metrics follow pytrec_eval (as MTEB uses it): nDCG@k with the qrel score as gain and a log2
discount, ideal DCG from the qrels; recall@k over the documents with a positive score; MRR@k is the
reciprocal rank of the first relevant document in the top k. Only queries that have qrels count.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import TextIO

import psycopg

from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder
from pgembed.encode.settings import settings_of
from pgembed.errors import UsageError
from pgembed.search import topk

Qrels = dict[str, dict[str, int]]


@dataclass(frozen=True)
class Metrics:
    ndcg: float
    recall: float
    mrr: float


@dataclass(frozen=True)
class Evaluation:
    model: str
    k: int
    queries: int  # queries scored: those with both text and qrels
    skipped_queries: int  # qrels whose query id has no text in the queries file
    missing_documents: int  # judged corpus ids that are not keys of the table
    exact: Metrics
    indexed: Metrics
    index_recall: float  # top k of the index against exact search's top k
    ef_search: int
    index_used: bool


def read_queries(path: Path) -> dict[str, str]:
    """BEIR queries: JSON lines with `_id` and `text`."""
    queries: dict[str, str] = {}
    with _open_text(path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                queries[str(record["_id"])] = str(record["text"])
            except (ValueError, KeyError, TypeError):
                raise UsageError(
                    f"{path}:{number}: expected a JSON object with `_id` and `text`"
                ) from None
    return queries


def read_qrels(path: Path) -> Qrels:
    """BEIR qrels: TSV `query-id, corpus-id, score` after a header line."""
    qrels: Qrels = {}
    with _open_text(path) as lines:
        for number, line in enumerate(lines, 1):
            fields = line.rstrip("\r\n").split("\t")
            if number == 1 and fields[0] in ("query-id", "query_id", "qid"):
                continue
            if not line.strip():
                continue
            try:
                qid, doc, score = fields
                qrels.setdefault(qid, {})[doc] = int(score)
            except ValueError:
                raise UsageError(
                    f"{path}:{number}: expected `query-id<TAB>corpus-id<TAB>score`"
                ) from None
    return qrels


def _open_text(path: Path) -> TextIO:
    try:
        return path.open(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def ndcg_at_k(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    dcg = sum(max(judged.get(doc, 0), 0) / math.log2(i + 2) for i, doc in enumerate(ranking[:k]))
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    relevant = {doc for doc, g in judged.items() if g > 0}
    return len(relevant.intersection(ranking[:k])) / len(relevant) if relevant else 0.0


def mrr_at_k(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    for i, doc in enumerate(ranking[:k]):
        if judged.get(doc, 0) > 0:
            return 1.0 / (i + 1)
    return 0.0


def score(runs: Mapping[str, Sequence[str]], qrels: Qrels, k: int) -> Metrics:
    """Mean metrics over the queries of `runs` (each a ranking of keys, best first)."""
    ids = [qid for qid in runs if qid in qrels]
    if not ids:
        return Metrics(0.0, 0.0, 0.0)
    return Metrics(
        ndcg=fmean(ndcg_at_k(runs[q], qrels[q], k) for q in ids),
        recall=fmean(recall_at_k(runs[q], qrels[q], k) for q in ids),
        mrr=fmean(mrr_at_k(runs[q], qrels[q], k) for q in ids),
    )


def overlap(approximate: Sequence[Sequence[str]], exact: Sequence[Sequence[str]]) -> float:
    """Mean share of exact search's results that the index also returned (recall@k vs exact)."""
    shares = [len(set(a) & set(e)) / len(e) for a, e in zip(approximate, exact, strict=True) if e]
    return fmean(shares) if shares else 1.0


def evaluate(
    conn: psycopg.Connection,
    spec: ModelSpec,
    queries: Mapping[str, str],
    qrels: Qrels,
    k: int = 10,
) -> Evaluation:
    if k < 1:
        raise UsageError("-k must be at least 1")
    ids = [qid for qid in qrels if qid in queries]
    if not ids:
        raise UsageError("no query in the qrels has a text in the queries file")
    vectors = embedder.get(settings_of(spec)).encode_queries([queries[q] for q in ids])
    exact = topk.exact(conn, spec, vectors, k)
    ef_search = topk.effective_ef_search(conn, spec, spec.ef_search)  # as pgembed.search
    indexed = topk.indexed(conn, spec, vectors, k, ef_search)
    judged = {doc for qid in ids for doc in qrels[qid]}
    return Evaluation(
        model=spec.name,
        k=k,
        queries=len(ids),
        skipped_queries=len(qrels) - len(ids),
        missing_documents=len(judged) - topk.count_keys(conn, spec, sorted(judged)),
        exact=score(dict(zip(ids, exact, strict=True)), qrels, k),
        indexed=score(dict(zip(ids, indexed, strict=True)), qrels, k),
        index_recall=overlap(indexed, exact),
        ef_search=ef_search,
        index_used=topk.uses_index(conn, spec, vectors[0], k),
    )
