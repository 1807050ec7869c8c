from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from helpers import cli
from pgembed import config, db
from pgembed.cli import demo

DEMO_COUNTS = (
    "SELECT count(*), count(embedding_demo_mean), count(embedding_demo_cls) "
    "FROM pgembed_demo.reviews"
)


def test_demo_runs_is_safe_to_run_twice_and_its_data_searches_well(db_url: str) -> None:
    first = cli("--database-url", db_url, "demo")
    assert first.exit_code == 0, first.output
    assert "324 sample rows inserted" in first.output
    assert "added model demo_mean " in first.output and "added model demo_cls " in first.output
    assert first.output.count('query: "') == 5
    assert "demo_mean (mean pooling)" in first.output and "demo_cls (CLS pooling)" in first.output
    second = cli("--database-url", db_url, "demo")
    assert second.exit_code == 0, second.output
    # A second run (a second clone on the shared embedded database) says why nothing is new.
    assert "0 sample rows inserted" not in second.output
    assert "0 vectors written" not in second.output
    assert (
        "pgembed_demo.reviews: the sample rows are already there: an earlier `pgembed demo` put "
        "them in this database\n"
    ) in second.output
    assert "synced: every sample row already has both models' vectors" in second.output
    assert "added model" not in second.output
    with db.connection(db_url) as conn:
        assert conn.execute(DEMO_COUNTS).fetchone() == (324, 324, 324)
        assert conn.execute("SELECT count(*) FROM pgembed.queue").fetchone() == (0,)
        rows = conn.execute("SELECT id, category FROM pgembed_demo.reviews").fetchall()
        categories = {int(key): category for key, category in rows}
    # The sample is meant to show semantic search: fruit queries find groceries, not gadgets.
    result = cli(
        "--database-url",
        db_url,
        "query",
        "crisp sweet apples to eat",
        "--model",
        "demo_mean",
        "-k",
        "5",
        "--json",
    )
    hits = json.loads(result.output)
    assert sum(categories[int(h["key"])] in ("groceries", "kitchen") for h in hits) >= 4


def test_demo_leaves_the_tour_names_alone_and_reset_removes_only_what_it_made(
    db_url: str,
) -> None:
    # The user's own `reviews` table and `minilm` model, as the README's tour makes them.
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE reviews (id bigint PRIMARY KEY, body text NOT NULL)")
        conn.execute("INSERT INTO reviews VALUES (1, 'The battery dies before lunch')")
    added = cli("--database-url", db_url, "model", "add", "minilm", "--table", "reviews",
                "--column", "body", "--precision", "fp32")  # fmt: skip
    assert added.exit_code == 0, added.output
    assert cli("--database-url", db_url, "demo").exit_code == 0
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE pgembed_demo.notes (id int)")  # the user's, in the demo schema
    reset = cli("--database-url", db_url, "demo", "--reset")
    assert reset.exit_code == 0, reset.output
    assert "removed model demo_mean" in reset.output and "removed model demo_cls" in reset.output
    assert "kept schema pgembed_demo" in reset.output
    with db.connection(db_url) as conn:
        models = [r[0] for r in conn.execute("SELECT name FROM pgembed.models ORDER BY name")]
        assert models == ["minilm"]
        assert conn.execute("SELECT to_regclass('pgembed_demo.reviews')").fetchone() == (None,)
        assert conn.execute("SELECT to_regclass('pgembed_demo.notes')").fetchone() != (None,)
        assert conn.execute("SELECT count(*) FROM reviews").fetchone() == (1,)
    again = cli("--database-url", db_url, "demo", "--reset")  # nothing left to remove
    assert again.exit_code == 0, again.output
    assert "removed model" not in again.output


def test_demo_refuses_to_touch_a_users_model_of_its_name(
    conn: psycopg.Connection, db_url: str
) -> None:
    conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text)")
    added = cli("--database-url", db_url, "model", "add", "demo_mean", "--table", "notes",
                "--column", "body", "--precision", "fp32")  # fmt: skip
    assert added.exit_code == 0, added.output
    for args in (("demo",), ("demo", "--reset")):
        result = cli("--database-url", db_url, *args)
        assert result.exit_code == 2, result.output
        assert "model demo_mean belongs to public.notes, not the demo" in result.output
    assert conn.execute("SELECT count(*) FROM pgembed.models").fetchone() == (1,)


def test_the_embedded_database_is_named_with_how_to_keep_one_per_project(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("PGEMBED_HOME", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))  # the per-user directory
    where = demo.location(None)  # no URL: the embedded server's, shared by default
    shared = config.home(create=False) / "pgdata"
    assert where.startswith(f"the embedded database in {shared}, which every")
    assert "PGEMBED_HOME=$PWD/.pgembed gives a project its own" in where
    # Once PGEMBED_HOME gives it a place of its own, it is not said to be shared.
    monkeypatch.setenv("PGEMBED_HOME", str(tmp_path))
    assert demo.location(None) == f"the embedded database in {tmp_path / 'pgdata'} (PGEMBED_HOME)"
    assert demo.location("postgresql://app@db/shop") == "this database"
