"""The README's first hour, run as written: a newcomer's commands must not drift from the code."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def first_hour() -> str:
    """The first shell block under the README's "A first hour" heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## A first hour") :]
    match = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert match, "no ```sh block under '## A first hour'"
    return match[1]


def test_the_first_hour_runs_as_written(tmp_path: Path) -> None:
    script = first_hour()
    assert script.lstrip().startswith("make demo")
    env = {k: v for k, v in os.environ.items() if k not in ("PGEMBED_DATABASE_URL", "DATABASE_URL")}
    env["PGEMBED_HOME"] = str(tmp_path / "home")
    run = ["bash", "-c", "set -euo pipefail\n" + script]
    try:
        done = subprocess.run(
            run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
        )
    finally:  # whatever happened, leave no server running
        subprocess.run(
            [str(ROOT / ".venv" / "bin" / "pgembed"), "db", "stop"],
            env=env, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "added model minilm" in out
    hits = [line.split("\t") for line in out.splitlines() if re.match(r"^\d+\t", line)]
    # The first query's two hits (the battery, then the charger), then the filtered one.
    assert [hit[0] for hit in hits] == ["1", "3", "2"], out
    assert "apples" in hits[2][2]
    assert "embedded 3/3" in out  # pgembed status
