"""The ORM example application (examples/orm_app.py) run as its own process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pgembed
from pgembed import db

ROOT = Path(__file__).parent.parent.parent
HIT = re.compile(r"^  (\d\.\d{3}) id=(\d+) rating=(\d) ")


def run_example(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "orm_app.py"), url],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's pgembed
        cwd=ROOT,
    )


def check_output(result: subprocess.CompletedProcess[str], embedded: int) -> None:
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"synced: {embedded} reviews embedded"
    nearest = [m.groups() for m in map(HIT.match, lines[2:5]) if m]
    similar = [m.groups() for m in map(HIT.match, lines[6:9]) if m]
    assert len(nearest) == len(similar) == 3
    assert nearest[0][1] == "2"  # "Battery life is outstanding"
    assert all(int(rating) >= 4 for _, _, rating in nearest)
    assert "1" not in {key for _, key, _ in similar}


def test_the_orm_example_runs_end_to_end(db_url: str) -> None:
    check_output(run_example(db_url), embedded=8)
    with db.connection(db_url) as conn:
        counted = conn.execute("SELECT count(embedding_app_minilm) FROM app_reviews").fetchone()
        assert counted == (8,)
    check_output(run_example(db_url), embedded=0)  # safe to run again


def test_the_orm_example_runs_beside_other_models(shop_url: str) -> None:
    # The shop has what `pgembed demo` used to make and the README's tour makes: a `reviews`
    # table watched by model `minilm`. The example once took that model for its own and crashed.
    check_output(run_example(shop_url), embedded=8)
    with db.connection(shop_url) as conn:
        names = conn.execute("SELECT name, table_name FROM pgembed.models ORDER BY 1").fetchall()
        assert names == [("app_minilm", "app_reviews"), ("minilm", "reviews")]


def test_a_model_of_its_name_on_another_table_is_one_line(db_url: str) -> None:
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY, body text)")
    pgembed.add_model("app_minilm", "notes", "body", database_url=db_url)
    result = run_example(db_url)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == (
        "orm_app: model 'app_minilm' already exists with table 'public.notes', not "
        "'public.app_reviews': pick another name, or change it with `pgembed model alter`"
    )
