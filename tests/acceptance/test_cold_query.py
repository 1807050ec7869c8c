"""A cold `pgembed query` process for an fp32 model: it never imports transformers or
sentence-transformers (the light encoder of encode/light.py), and its hits are those of a warm
process; `--help` imports no model library at all."""

from __future__ import annotations

import json
import re

import pytest

from helpers import run_cli
from pgembed import db
from pgembed.catalog import registry
from pgembed.lifecycle import models
from pgembed.search import planner
from pgembed.sync import worker


def imported(stderr: str) -> set[str]:
    """Top-level packages in `python -X importtime` output."""
    return {m.group(1).split(".")[0] for m in re.finditer(r"\|\s+([\w.]+)\s*$", stderr, re.M)}


def test_cold_query_skips_sentence_transformers_and_matches_a_warm_process(
    shop_url: str,
) -> None:
    # fp32, not the sample's `auto`: on a CPU without native bf16 `auto` takes an onnx engine,
    # which the light encoder does not reproduce (it loads the full stack, by design).
    with db.connection(shop_url) as conn:
        models.add(conn, models.AddRequest("plain", "reviews", "text", precision="fp32"))
    worker.Worker(shop_url, worker.Options(once=True)).run()
    text = "my phone runs out of power by noon"
    args = ["--database-url", shop_url, "query", text, "--model", "plain", "-k", "5", "--json"]
    cold = run_cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert cold.returncode == 0, cold.stderr
    modules = imported(cold.stderr)
    assert "torch" in modules and "pgembed" in modules  # the parse works
    assert not modules & {"transformers", "sentence_transformers", "sklearn", "scipy"}
    hits = json.loads(cold.stdout)
    with db.connection(shop_url) as conn:
        warm = planner.query(conn, registry.get(conn, "plain"), text, 5)
    assert [(h["key"], h["text"]) for h in hits] == [(h.key, h.text) for h in warm]
    assert [h["similarity"] for h in hits] == pytest.approx([h.similarity for h in warm], abs=1e-6)


def test_help_imports_no_model_library() -> None:
    for args in (["--help"], ["serve", "--help"], ["query", "--help"]):
        result = run_cli(*args, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert result.returncode == 0, result.stderr
        assert not imported(result.stderr) & {"torch", "transformers", "sentence_transformers"}
