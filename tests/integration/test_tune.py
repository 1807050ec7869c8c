"""`pgembed tune` on the 324 embedded sample reviews: queries that are not rows, never below the
default's recall unless asked, and --queries files good and bad."""

from __future__ import annotations

import json
import random
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from helpers import cli
from pgembed import db
from pgembed.catalog import registry
from pgembed.search import tune


def tuned(shop_url: str, *args: str) -> dict[str, object]:
    result = cli("--database-url", shop_url, "tune", "minilm", "--json", *args)
    assert result.exit_code == 0, result.output
    report: dict[str, object] = json.loads(result.output)
    return report


def recorded(shop_url: str) -> int | None:
    with db.connection(shop_url) as conn:
        return registry.get(conn, "minilm").ef_search


def test_tune_never_goes_below_the_default_unless_asked(shop_url: str) -> None:
    # A target that ef_search 10 already meets: the old tune recorded 10.
    report = tuned(shop_url, "--target-recall", "0.5")
    assert report["queries"] == tune.EXCERPTS and report["sample"] == 200
    assert report["default_ef_search"] == 40
    assert [s["ef_search"] for s in report["steps"]] == [40]  # type: ignore[attr-defined]
    assert report["ef_search"] == 40 and recorded(shop_url) == 40
    assert report["recall"] == report["default_recall"]
    # A target nothing can beat: every step is at or above the default, none below its recall.
    strict = tuned(shop_url, "--target-recall", "1", "--sample", "60")
    efs = [s["ef_search"] for s in strict["steps"]]  # type: ignore[attr-defined]
    assert efs[0] == 40 and min(efs) == 40
    assert strict["ef_search"] >= 40  # type: ignore[operator]
    assert strict["recall"] >= strict["default_recall"]  # type: ignore[operator]
    # Asked: the ladder starts at k, and the smallest value meeting the target is recorded.
    below = tuned(shop_url, "--target-recall", "0.5", "--allow-below-default")
    assert below["steps"][0]["ef_search"] == 10 and below["ef_search"] == 10  # type: ignore[index]
    assert recorded(shop_url) == 10


def test_the_server_default_is_the_floor(shop_url: str) -> None:
    with psycopg.connect(shop_url, autocommit=True) as conn:
        conn.execute("LOAD 'vector'")
        name = sql.Identifier(conn.info.dbname)
        conn.execute(sql.SQL("ALTER DATABASE {} SET hnsw.ef_search = 60").format(name))
    report = tuned(shop_url, "--target-recall", "0.5", "--sample", "40")
    assert report["default_ef_search"] == 60 and report["ef_search"] == 60


def test_choose_keeps_the_default_when_larger_values_measure_lower() -> None:
    # Measured recall is not monotone in ef_search; a miss keeps the best, the default first.
    steps = [tune.Step(40, 0.97, 0.96), tune.Step(60, 0.96, 0.95), tune.Step(80, 0.97, 0.965)]
    assert tune.choose(steps, 0.99, 0.97) == steps[0]
    # The target is for the lower bound; and no recall below the default's (the floor).
    sure = [*steps, tune.Step(100, 0.995, 0.985), tune.Step(150, 0.996, 0.991)]
    assert tune.choose(sure, 0.99, 0.97) == sure[-1]
    assert tune.choose(sure, 0.95, 0.97) == steps[0]
    low_floor = [tune.Step(40, 0.999, 0.98), tune.Step(60, 0.995, 0.992)]
    assert tune.choose(low_floor, 0.99, 0.999) == low_floor[0]
    assert tune.ladder(10, 40, allow_below_default=False)[:2] == [40, 60]
    assert tune.ladder(10, 50, allow_below_default=False)[:2] == [50, 60]
    assert tune.ladder(10, 40, allow_below_default=True)[:3] == [10, 20, 40]
    assert tune.ladder(15, 40, allow_below_default=True)[0] == 20  # none below k


def test_excerpts_are_short_runs_of_rows_words(shop_url: str) -> None:
    with db.connection(shop_url) as conn:
        spec = registry.get(conn, "minilm")
        texts = tune.excerpts(conn, spec, 50)
        again = tune.excerpts(conn, spec, 50)
        rows = {" ".join(r[0].split()) for r in conn.execute("SELECT text FROM reviews")}
    assert len(texts) == 50 and texts == again  # a fixed choice: runs compare
    assert not rows & set(texts)  # not rows' texts
    assert all(1 <= len(t.split()) <= 25 for t in texts)
    assert all(any(t in r for r in rows) for t in texts)  # each a run of some row's words


def test_an_unspaced_text_is_cut_in_characters() -> None:
    text = "電池の持ちが悪く、昼前には切れてしまう。" * 10
    cut = tune.excerpt(text, random.Random(0))
    assert 10 <= len(cut) <= 25 and cut in text


def test_queries_file_is_used(shop_url: str, tmp_path: Path) -> None:
    plain = tmp_path / "queries.txt"
    plain.write_text("battery dies fast\n\n  apples for a pie  \nslow delivery\n")
    report = tuned(shop_url, "--queries", str(plain), "--target-recall", "0.5")
    assert report["queries"] == str(plain) and report["sample"] == 3
    beir = tmp_path / "queries.jsonl"
    beir.write_text("".join(json.dumps({"_id": i, "text": t}) + "\n" for i, t in enumerate("ab")))
    assert tuned(shop_url, "--queries", str(beir), "--sample", "1")["sample"] == 1
    assert tune.read_queries(plain) == ["battery dies fast", "apples for a pie", "slow delivery"]
    assert tune.read_queries(beir) == ["a", "b"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read --queries"),
        ("dir", "cannot read --queries"),
        (b"\n  \n", "has no query"),
        (b"\xff\xfe\x00bad", "is not UTF-8 text"),
        (b'{"_id": "1", "text": "ok"}\n{"_id": "2"}\n', ":2: expected a JSON object"),
    ],
)
def test_a_bad_queries_file_is_one_line_and_exit_2(
    shop_url: str, tmp_path: Path, content: bytes | str | None, message: str
) -> None:
    path = tmp_path / "q.txt"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    result = cli("--database-url", shop_url, "tune", "minilm", "--queries", str(path))
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert recorded(shop_url) is None
