"""The IMDb reviews of tests/data (where each comes from: its SOURCE.md), as their CSV rows."""

from __future__ import annotations

import csv
from pathlib import Path

DATA = Path(__file__).parent / "data"


def read(name: str) -> list[dict[str, str]]:
    """The rows of tests/data/`name` (id, ..., rating, text), each a dict by column."""
    with (DATA / name).open(newline="") as file:
        return list(csv.DictReader(file))


LONG = read("imdb-long-reviews.csv")  # 12 reviews of 600+ word pieces
SHORT = read("imdb-reviews-excerpt.csv")  # 40 that fit one window
CHUNKED = read("imdb-chunk-reviews.csv")  # 240 of 2-3 windows
