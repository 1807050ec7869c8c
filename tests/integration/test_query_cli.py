"""`pgembed query` with --filter, --similar-to, --hybrid and --ef-search."""

from __future__ import annotations

import json

from helpers import cli
from pgembed import db


def query(url: str, *args: str) -> list[dict[str, object]]:
    result = cli("--database-url", url, "query", "--model", "minilm", "--json", *args)
    assert result.exit_code == 0, result.output
    found: list[dict[str, object]] = json.loads(result.output)
    return found


def ratings(url: str, keys: list[object]) -> set[int]:
    with db.connection(url) as conn:
        found = conn.execute(
            "SELECT DISTINCT rating FROM reviews WHERE id::text = ANY(%s)",
            ([str(k) for k in keys],),
        )
        return {r for (r,) in found}


def test_filter(shop_url: str) -> None:
    hits = query(shop_url, "battery dies fast", "-k", "6", "--filter", '{"rating": {"$gte": 4}}')
    assert len(hits) == 6 and set(hits[0]) == {"key", "similarity", "text"}
    assert ratings(shop_url, [h["key"] for h in hits]) <= {4, 5}
    five = query(shop_url, "battery dies fast", "--filter", '{"rating": 5, "category": "phones"}')
    assert ratings(shop_url, [h["key"] for h in five]) == {5}


def test_similar_to_hybrid_and_ef_search(shop_url: str) -> None:
    similar = query(shop_url, "--similar-to", "1", "-k", "3")
    assert len(similar) == 3 and 1 not in {h["key"] for h in similar}
    hybrid = query(shop_url, "stamina of a goldfish", "--hybrid", "-k", "3")
    assert set(hybrid[0]) == {"key", "score", "text"} and hybrid[0]["key"] == 4
    tuned = query(shop_url, "battery dies fast", "--ef-search", "200", "-k", "3")
    assert len(tuned) == 3
    text = cli(
        "--database-url",
        shop_url,
        "query",
        "stamina of a goldfish",
        "--model",
        "minilm",
        "--hybrid",
        "-k",
        "1",
    )
    assert text.exit_code == 0 and text.output.startswith("4\t0.0")


def test_usage_errors_are_one_line_exit_2(shop_url: str) -> None:
    cases = [
        (["x", "--filter", "{not json"], "--filter is not valid JSON"),
        (["x", "--filter", "[1, 2]"], "--filter must be a JSON object"),
        (["x", "--filter", '{"nope": 1}'], 'has no column "nope"'),
        (["x", "--filter", '{"rating": {"$regex": "."}}'], "unknown operator"),
        (["x", "--similar-to", "1"], "either TEXT or --similar-to"),
        ([], "either TEXT or --similar-to"),
        (["--similar-to", "1", "--hybrid"], "--hybrid needs TEXT"),
    ]
    for args, message in cases:
        result = cli("--database-url", shop_url, "query", "--model", "minilm", *args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert (
        cli(
            "--database-url", shop_url, "query", "x", "--model", "minilm", "--ef-search", "0"
        ).exit_code
        == 2
    )
    missing = cli("--database-url", shop_url, "query", "--model", "minilm", "--similar-to", "99999")
    assert missing.exit_code == 1 and "no row with id" in missing.output
