"""`pgembed embed` and the README's psql recipe, run as written in real psql (the wheel's, through
`pgembed db psql`): a psql user searches by text, with any search_path for pgembed.search. The
checks of what `pgembed query`/`embed` print run the CLI in this process, but for standard input's
decoding, which is a process's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import run_cli_here
from pgembed import db
from pgembed.lifecycle import models
from pgembed.sync import worker

ROOT = Path(__file__).resolve().parents[2]
QUERY = "battery life is short"
ROWS = [
    (1, "The battery dies before lunch", 2),
    (2, "Crisp, sweet apples from the market", 5),
    (3, "The charger stopped working", 1),
    (4, "Battery lasts two days, great phone", 4),
]


def recipe() -> str:
    """The psql block under the README's "Plain SQL" heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Plain SQL") :]
    match = re.search(r"```psql\n(.*?)```", section, re.DOTALL)
    assert match, "no ```psql block under '## Plain SQL'"
    return match[1]


@pytest.fixture
def tour_url(db_url: str) -> str:
    """The first hour's `reviews` table with model `minilm`, embedded."""
    with db.connection(db_url) as conn:
        conn.execute("CREATE TABLE reviews (id bigint PRIMARY KEY, body text NOT NULL, rating int)")
        conn.cursor().executemany("INSERT INTO reviews VALUES (%s, %s, %s)", ROWS)
        models.add(conn, models.AddRequest("minilm", "reviews", "body", precision="fp32"))
    worker.Worker(db_url, worker.Options(once=True)).run()
    return db_url


def psql(url: str, script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`pgembed db psql -f SCRIPT` with the URL in the environment, as a user of their own
    database sets it; `pgembed` on PATH (the backticks run it)."""
    path = tmp_path / "recipe.sql"
    path.write_text(script)
    env = {**os.environ, "PGEMBED_DATABASE_URL": url}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    psql_args = ["-X", "-At", "-F", "\t", "-v", "ON_ERROR_STOP=1", "-f", str(path)]
    return subprocess.run(
        [sys.executable, "-m", "pgembed", "db", "psql", *psql_args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def rows(output: str) -> list[list[str]]:
    """The result rows psql printed (not its command tags, such as SET)."""
    return [line.split("\t") for line in output.splitlines() if line[:1].isdigit()]


def test_the_readme_recipe_runs_in_psql(tour_url: str, tmp_path: Path) -> None:
    script = recipe()
    assert f"pgembed embed '{QUERY}' --model minilm" in script
    done = psql(tour_url, script, tmp_path)
    assert done.returncode == 0, done.stderr
    found = rows(done.stdout)
    plain, helper, similar = found[:4], found[4:6], found[6:]
    # Plain SQL: every row, nearest first: the two battery reviews lead.
    assert {plain[0][0], plain[1][0]} == {"1", "4"}, found
    assert len(plain) == 4 and all(-1 <= float(r[2]) <= 1 for r in plain)
    # pgembed.search with the filter: only ratings of 4 or more, the battery one first.
    assert [r[0] for r in helper] == ["4", "2"], found
    # The same vector as `pgembed query` searches with: the same similarities.
    query = run_cli_here("--database-url", tour_url, "query", QUERY, "--model", "minilm", "--json")
    assert query.returncode == 0, query.stderr
    expected = {str(hit["key"]): hit["similarity"] for hit in json.loads(query.stdout)}
    for key, _body, similarity in plain:
        assert float(similarity) == pytest.approx(expected[key], abs=1e-6)
    assert "1" not in [r[0] for r in similar] and len(similar) == 3


def test_pgembed_search_needs_no_search_path(tour_url: str, tmp_path: Path) -> None:
    # The README's promise: the helper's line works with pgvector's schema off the path.
    lines = recipe().splitlines()
    search = next(line for line in lines if "pgembed.search(" in line)
    script = "\n".join([lines[0], "SET search_path = pg_catalog, pg_temp;", search, ""])
    done = psql(tour_url, script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert [r[0] for r in rows(done.stdout)][:2] == ["4", "2"]


def test_embed_prints_the_models_query_vector(tour_url: str) -> None:
    done = run_cli_here("--database-url", tour_url, "embed", QUERY, "--model", "minilm")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert re.fullmatch(r"\[-?[0-9.]+(,-?[0-9.]+)*\]", line), line[:200]
    vector = np.array(json.loads(line), dtype=np.float32)
    assert vector.shape == (384,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-2  # bf16
    # What psql reads back is the same float32 vector, digit for digit.
    with db.connection(tour_url) as conn:
        row = conn.execute("SELECT %s::vector::text", (line,)).fetchone()
    assert row is not None and np.array_equal(np.array(json.loads(row[0]), np.float32), vector)

    # stdin with `-`, and --format json: the same vector.
    command = ["embed", "-", "--model", "minilm", "--format", "json"]
    piped = subprocess.run(
        [sys.executable, "-m", "pgembed", "--database-url", tour_url, *command],
        input=QUERY + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert piped.returncode == 0, piped.stderr
    body = json.loads(piped.stdout)
    assert (body["model"], body["dimensions"]) == ("minilm", 384)
    assert np.array_equal(np.array(body["vector"], dtype=np.float32), vector)
    # Bytes that are not UTF-8 are said to be that (in the C locale they were read as lone
    # surrogates, and refused as such).
    bad = subprocess.run(
        [sys.executable, "-m", "pgembed", "--database-url", tour_url, *command],
        input=b"\xff\xfe bad",
        capture_output=True,
        timeout=120,
        check=False,
        env={**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0"},
    )
    assert bad.returncode == 2
    assert bad.stderr.decode() == (
        "pgembed: error: standard input is not UTF-8 text (byte 0xff at offset 0)\n"
    )


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["", "--model", "minilm"], 2, "pgembed: error: the text to embed is empty"),
        (["  ", "--model", "minilm"], 2, "pgembed: error: the text to embed is empty"),
        (
            ["battery", "--model", "minlm"],
            1,
            "pgembed: error: unknown model 'minlm': did you mean 'minilm'? "
            "(see `pgembed model list`)",
        ),
    ],
)
def test_bad_input_is_one_line(tour_url: str, args: list[str], code: int, message: str) -> None:
    done = run_cli_here("--database-url", tour_url, "embed", *args)
    assert (done.returncode, done.stderr.strip(), done.stdout) == (code, message, "")
