"""The ORM example application (examples/orm_app.py) run as its own process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from pgembed import db

ROOT = Path(__file__).parent.parent.parent


def test_the_orm_example_runs_end_to_end(db_url: str) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "orm_app.py"), db_url],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's pgembed
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "synced: 8 reviews embedded"
    hit = re.compile(r"^  (\d\.\d{3}) id=(\d+) rating=(\d) ")
    nearest = [m.groups() for m in map(hit.match, lines[2:5]) if m]
    similar = [m.groups() for m in map(hit.match, lines[6:9]) if m]
    assert len(nearest) == len(similar) == 3
    assert nearest[0][1] == "2"  # "Battery life is outstanding"
    assert all(int(rating) >= 4 for _, _, rating in nearest)
    assert "1" not in {key for _, key, _ in similar}
    with db.connection(db_url) as conn:
        assert conn.execute("SELECT count(embedding_minilm) FROM app_reviews").fetchone() == (8,)
