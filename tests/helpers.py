"""Shared test data and CLI runners."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner, Result

from pgembed.cli import main

REVIEWS = [
    (1, "The battery dies before lunch, I have to charge it twice a day."),
    (2, "Phone can't make it through the morning without being plugged in."),
    (3, "These apples are crisp, sweet and juicy."),
    (4, "The charger gets very hot and stopped working after a week."),
    (5, "Shipping took three weeks and the box arrived crushed."),
    (6, "Great noise cancelling headphones, silence on the train."),
    (7, "Baked an apple pie with these, the fruit held its shape."),
    (8, "Customer service never answered my emails."),
]


def cli(*args: str) -> Result:
    """Run the CLI in-process (the model stays loaded between calls)."""
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run the real `pgembed` executable as a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "pgembed", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=Path(__file__).parent.parent,
    )
