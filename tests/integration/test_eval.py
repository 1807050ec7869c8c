"""Quality metrics on a corpus small enough to score by hand, and ef_search tuning."""

from __future__ import annotations

import json
import math
from pathlib import Path

import psycopg
import pytest

from helpers import cli
from pgembed.catalog import registry
from pgembed.lifecycle import models
from pgembed.search import evaluate
from pgembed.sync import worker

DOCS = {
    "d1": "The battery of this phone dies before lunch.",
    "d2": "These apples are crisp, sweet and juicy.",
    "d3": "Shipping took three weeks and the box arrived crushed.",
    "d4": "Great noise cancelling headphones for the train.",
    "d5": "The customer service never answered my emails.",
    "d6": "The customer service never answered my emails!",
    "d7": "Baked an apple pie, the fruit held its shape.",
    "d8": "The charger gets very hot after a week.",
}
# Each query is a document's exact text, so that document is certainly ranked first
# (distance 0); d6 is a near copy of d5, so it is certainly second for q5.
QUERIES = {"q1": DOCS["d1"], "q2": DOCS["d2"], "q3": DOCS["d3"], "q4": DOCS["d4"]}
QUERIES |= {"q5": DOCS["d5"], "q6": "a query nobody judged"}
QRELS = [
    ("q1", "d1", 1),
    ("q1", "d8", 0),  # judged not relevant: no gain, not counted by recall
    ("q2", "d2", 1),
    ("q2", "gone1", 1),  # relevant but not in the table: never retrieved
    ("q3", "gone2", 1),
    ("q4", "d4", 2),
    ("q4", "gone3", 1),
    ("q5", "d6", 1),
    ("q7", "d7", 1),  # a query id without text: skipped
]
LOG2_3 = math.log2(3)
# By hand, k = 3: (nDCG, recall, MRR) per query with qrels and text.
EXPECTED = {
    "q1": (1.0, 1.0, 1.0),
    "q2": (1 / (1 + 1 / LOG2_3), 0.5, 1.0),
    "q3": (0.0, 0.0, 0.0),
    "q4": (2 / (2 + 1 / LOG2_3), 0.5, 1.0),
    "q5": (1 / LOG2_3, 1.0, 0.5),
}


def mean(i: int) -> float:
    return sum(v[i] for v in EXPECTED.values()) / len(EXPECTED)


@pytest.fixture
def corpus(conn: psycopg.Connection, db_url: str, tmp_path: Path) -> tuple[Path, Path]:
    conn.execute("CREATE TABLE docs (id text PRIMARY KEY, body text)")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO docs VALUES (%s, %s)", list(DOCS.items()))
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    worker.Worker(db_url, worker.Options(once=True)).run()
    queries = tmp_path / "queries.jsonl"
    queries.write_text(
        "".join(
            json.dumps({"_id": q, "text": t, "metadata": {}}) + "\n" for q, t in QUERIES.items()
        )
    )
    qrels = tmp_path / "test.tsv"
    qrels.write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in QRELS)
    )
    return queries, qrels


def test_eval_scores_exact_and_indexed_search(
    corpus: tuple[Path, Path], conn: psycopg.Connection
) -> None:
    queries, qrels = corpus
    result = evaluate.evaluate(
        conn,
        registry.get(conn, "minilm"),
        evaluate.read_queries(queries),
        evaluate.read_qrels(qrels),
        k=3,
    )
    assert (result.queries, result.skipped_queries, result.missing_documents) == (5, 1, 3)
    for metrics in (result.exact, result.indexed):
        assert metrics.ndcg == pytest.approx(mean(0))
        assert metrics.recall == pytest.approx(mean(1))
        assert metrics.mrr == pytest.approx(mean(2))
    assert result.index_recall == 1.0
    assert result.index_used and result.ef_search == 40


def test_eval_cli_json_and_text(corpus: tuple[Path, Path], db_url: str) -> None:
    queries, qrels = corpus
    args = ["--database-url", db_url, "eval", "minilm", "--queries", str(queries)]
    out = cli(*args, "--qrels", str(qrels), "-k", "3", "--json")
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["k"] == 3 and report["queries"] == 5
    assert report["exact"]["ndcg"] == pytest.approx(mean(0))
    assert report["indexed"]["mrr"] == pytest.approx(mean(2))
    text = cli(*args, "--qrels", str(qrels), "-k", "3")
    assert text.exit_code == 0, text.output
    assert "nDCG@3" in text.output and "indexed (ef_search 40)" in text.output
    assert f"{mean(0):.4f}" in text.output
    bad = cli(*args, "--qrels", str(queries))
    assert bad.exit_code == 2 and "expected `query-id<TAB>corpus-id<TAB>score`" in bad.output
    missing = cli(*args, "--qrels", "/no/such/file.tsv")
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_tune_records_the_smallest_ef_search_meeting_the_target(
    corpus: tuple[Path, Path], conn: psycopg.Connection, db_url: str
) -> None:
    queries, _ = corpus
    stored = cli("--database-url", db_url, "tune", "minilm", "--target-recall", "0.9", "--json")
    assert stored.exit_code == 0, stored.output
    report = json.loads(stored.output)
    # Excerpts of the 8 rows as queries; the ladder starts at the default, 40 (more: test_tune.py).
    assert report["reached"] and report["ef_search"] == 40 and report["sample"] == 8
    assert registry.get(conn, "minilm").ef_search == 40
    args = ("--queries", str(queries), "-k", "3", "--allow-below-default")
    given = cli("--database-url", db_url, "tune", "minilm", *args)
    assert given.exit_code == 0, given.output
    assert "ef_search 10 recorded" in given.output
    assert registry.get(conn, "minilm").ef_search == 10
    # eval reports the recorded value as the one its indexed search ran with.
    result = evaluate.evaluate(
        conn, registry.get(conn, "minilm"), evaluate.read_queries(queries), {"q1": {"d1": 1}}, 3
    )
    assert result.ef_search == 10
    bad = cli("--database-url", db_url, "tune", "minilm", "--target-recall", "1.5")
    assert bad.exit_code == 2


def test_tune_without_vectors_is_a_clear_error(conn: psycopg.Connection, db_url: str) -> None:
    conn.execute("CREATE TABLE docs (id text PRIMARY KEY, body text)")
    models.add(conn, models.AddRequest("minilm", "docs", "body", precision="fp32"))
    result = cli("--database-url", db_url, "tune", "minilm")
    assert result.exit_code == 1 and "no vectors yet" in result.output
