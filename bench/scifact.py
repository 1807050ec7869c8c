"""Retrieval quality on BEIR SciFact, next to the published MTEB score of all-MiniLM-L6-v2.

    python -m bench.scifact [--data ../shared/data/scifact] [--database-url URL] [--out FILE]
                            [--precision fp32|bf16|int8] [--mean-only]

Loads the corpus with `pgembed load` semantics (document = `(title + " " + text).strip()`, as
MTEB encodes it), adds all-MiniLM-L6-v2 with mean pooling (the checkpoint's own) and with CLS
pooling, both in fp32 like the published run, syncs both, and runs `pgembed eval` on the 300
test queries: exact search, indexed search at pgvector's default ef_search, and indexed search
again after `pgembed tune --target-recall 0.99` (as a user runs it: excerpts of rows as queries)
and after the same with the train split's queries as `--queries`. It also records, at each
ef_search, the index's recall@10 against exact search for three kinds of queries (the real test
queries, the excerpts `tune` now uses, and stored vectors as `tune` used before) and the test
queries' nDCG@10. Without a URL it uses a fresh embedded server under a temporary PGEMBED_HOME.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import recall_curves
from bench.env import embedded_server
from pgembed import db, defaults, loader, migrate
from pgembed.catalog import registry
from pgembed.lifecycle import models
from pgembed.search import evaluate, tune
from pgembed.sync import worker

REPO = Path(__file__).resolve().parent.parent
# MTEB results, sentence-transformers/all-MiniLM-L6-v2, SciFact test split (see SOURCE.md).
PUBLISHED = {"ndcg": 0.64508, "recall": 0.78333, "mrr": 0.60473}
MODELS = (("minilm", "mean"), ("minilm_cls", "cls"))
TABLE = "scifact"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared/data/scifact")
    parser.add_argument("--database-url", help="default: a fresh embedded server")
    parser.add_argument("--home", type=Path, help="reuse this PGEMBED_HOME (e.g. a previous run's)")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/scifact.json")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=defaults.CPU_CLAIM_SIZE,
        help="keys claimed at once, as `pgembed sync --claim-size`",
    )
    parser.add_argument(
        "--precision",
        default="fp32",
        help="of both models (default fp32, as published); e.g. bf16 to check its quality",
    )
    parser.add_argument("--mean-only", action="store_true", help="skip the CLS-pooling model")
    args = parser.parse_args(argv)
    chosen = MODELS[:1] if args.mean_only else MODELS
    # A new PGEMBED_HOME is kept after the run, for `--home` to reuse.
    url = args.database_url or embedded_server(
        args.home or Path(tempfile.mkdtemp(prefix="pgembed-bench-"))
    )

    with db.connection(url) as conn:
        migrate.migrate(conn)
    timings: dict[str, float] = {}
    with db.connection(url) as conn:
        started = time.monotonic()
        loaded = loader.load(
            conn,
            loader.LoadRequest(
                args.data / "corpus.jsonl.gz", TABLE, key="_id", text_columns=("title", "text")
            ),
        )
        timings["load_seconds"] = time.monotonic() - started
        for name, pooling in chosen:
            if not registry.exists(conn, name):
                request = models.AddRequest(
                    name, TABLE, "text", pooling=pooling, precision=args.precision
                )
                spec = models.add(conn, request)[0]
                print(f"{name}: precision {spec.precision}: {spec.precision_note}", file=sys.stderr)
    print(f"corpus: {loaded.read} documents ({loaded.inserted} new)", file=sys.stderr)

    started = time.monotonic()
    options = worker.Options(
        models=tuple(n for n, _ in chosen), claim_size=args.batch_size, once=True
    )
    stats = worker.Worker(url, options).run()
    timings["sync_seconds"] = time.monotonic() - started
    print(f"synced {stats.written} vectors in {timings['sync_seconds']:.0f} s", file=sys.stderr)

    queries = evaluate.read_queries(args.data / "queries.jsonl")
    qrels = evaluate.read_qrels(args.data / "qrels/test.tsv")
    train = [queries[q] for q in evaluate.read_qrels(args.data / "qrels/train.tsv")]
    results: dict[str, Any] = {}
    with db.connection(url) as conn:
        for name, pooling in chosen:
            results[name] = _evaluate(conn, name, pooling, queries, qrels, train)
            results[name]["precision"] = registry.get(conn, name).precision
    report = {
        "dataset": "BEIR SciFact, test split (300 queries, 5,183 documents)",
        "published": {"model": "sentence-transformers/all-MiniLM-L6-v2", "k": 10, **PUBLISHED},
        "results": results,
        "corpus_documents": loaded.read,
        "timings": timings,
        "machine": _machine(),
        "command": "python -m bench.scifact "
        + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(_markdown(report))
    return 0


def _evaluate(
    conn: Any,
    name: str,
    pooling: str,
    queries: dict[str, str],
    qrels: evaluate.Qrels,
    train: list[str],
) -> dict[str, Any]:
    tune.record(conn, name, 200)
    wide = evaluate.evaluate(conn, registry.get(conn, name), queries, qrels, k=10)
    tune.record(conn, name, None)  # pgvector's default ef_search (40)
    default = evaluate.evaluate(conn, registry.get(conn, name), queries, qrels, k=10)
    curves = recall_curves.measure(conn, registry.get(conn, name), queries, qrels)
    tuned = tune.tune(conn, registry.get(conn, name), 0.99, 10)  # `pgembed tune`'s defaults
    after = evaluate.evaluate(conn, registry.get(conn, name), queries, qrels, k=10)
    tune.record(conn, name, None)
    given = tune.tune(conn, registry.get(conn, name), 0.99, 10, train, 200, source="train split")
    after_given = evaluate.evaluate(conn, registry.get(conn, name), queries, qrels, k=10)
    return {
        "pooling": pooling,
        "default_ef_search": dataclasses.asdict(default),
        "tune": dataclasses.asdict(tuned),
        "tuned_ef_search": dataclasses.asdict(after),
        "tune_train_queries": dataclasses.asdict(given),
        "tuned_train_queries_ef_search": dataclasses.asdict(after_given),
        "ef_search_200": dataclasses.asdict(wide),
        "curves": curves,
    }


def _machine() -> dict[str, Any]:
    cpu = next(
        (line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")),
        platform.processor(),
    )
    import torch

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": torch.cuda.is_available(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "sentence_transformers": metadata.version("sentence-transformers"),
        "transformers": metadata.version("transformers"),
        "pgvector_python": metadata.version("pgvector"),
    }


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        "| model | search | ef_search | nDCG@10 | recall@10 | MRR@10 | index recall@10 vs exact |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| published (MTEB) | exact | - | {PUBLISHED['ndcg']:.5f} | {PUBLISHED['recall']:.5f} "
        f"| {PUBLISHED['mrr']:.5f} | - |",
    ]
    for name, result in report["results"].items():
        default, after = result["default_ef_search"], result["tuned_ef_search"]
        given = result["tuned_train_queries_ef_search"]
        label = f"{name} ({result['pooling']})"
        rows = (
            ("exact", "-", default["exact"], "-"),
            ("indexed", default["ef_search"], default["indexed"], default["index_recall"]),
            ("indexed, tuned", after["ef_search"], after["indexed"], after["index_recall"]),
            (
                "indexed, tuned on train",
                given["ef_search"],
                given["indexed"],
                given["index_recall"],
            ),
            (
                "indexed",
                200,
                result["ef_search_200"]["indexed"],
                result["ef_search_200"]["index_recall"],
            ),
        )
        for search, ef, m, index_recall in rows:
            recall = index_recall if isinstance(index_recall, str) else f"{index_recall:.4f}"
            lines.append(
                f"| {label} | {search} | {ef} | {m['ndcg']:.5f} | {m['recall']:.5f} "
                f"| {m['mrr']:.5f} | {recall} |"
            )
        lines += ["", *_curve_table(result["curves"])]
    return "\n".join(lines)


def _curve_table(curves: dict[str, Any]) -> list[str]:
    """Recall@10 against exact search by ef_search, one row per kind of query; test nDCG@10."""
    efs = list(curves["test_ndcg"])
    lines = [
        "| queries | " + " | ".join(str(ef) for ef in efs) + " | mean gap |",
        "| --- |" + " ---: |" * (len(efs) + 1),
    ]
    for kind, curve in curves["recall"].items():
        cells = [f"{curve[ef]:.4f}" if ef in curve else "-" for ef in efs]
        gap = curves["gap_to_test_queries"][kind]["mean_abs"]
        lines.append(f"| {kind} | " + " | ".join(cells) + f" | {gap:.4f} |")
    ndcg = " | ".join(f"{v:.5f}" for v in curves["test_ndcg"].values())
    return [*lines, f"| test nDCG@10 | {ndcg} | |"]


if __name__ == "__main__":
    sys.exit(main())
