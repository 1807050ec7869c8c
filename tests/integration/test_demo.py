from __future__ import annotations

import json

from helpers import cli
from pgembed import db


def test_demo_runs_is_safe_to_run_twice_and_its_data_searches_well(db_url: str) -> None:
    first = cli("--database-url", db_url, "demo")
    assert first.exit_code == 0, first.output
    assert "324 sample rows inserted" in first.output
    assert "added model minilm " in first.output and "added model minilm_cls " in first.output
    assert first.output.count('query: "') == 5
    assert "minilm (mean pooling)" in first.output and "minilm_cls (CLS pooling)" in first.output
    second = cli("--database-url", db_url, "demo")
    assert second.exit_code == 0, second.output
    assert "0 sample rows inserted" in second.output
    assert "added model" not in second.output
    with db.connection(db_url) as conn:
        counts = conn.execute(
            "SELECT count(*), count(embedding_minilm), count(embedding_minilm_cls) FROM reviews"
        ).fetchone()
        assert counts == (324, 324, 324)
        assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
        categories = dict(conn.execute("SELECT id::text, category FROM reviews").fetchall())
    # The sample is meant to show semantic search: fruit queries find groceries, not gadgets.
    result = cli(
        "--database-url",
        db_url,
        "query",
        "crisp sweet apples to eat",
        "--model",
        "minilm",
        "-k",
        "5",
        "--json",
    )
    hits = json.loads(result.output)
    assert sum(categories[h["key"]] in ("groceries", "kitchen") for h in hits) >= 4
