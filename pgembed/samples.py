"""The sample reviews shipped with pgembed (data/reviews.csv): the demo's rows, and the texts a
precision is checked on when a table has too few of its own."""

from __future__ import annotations

import csv
from importlib import resources

Review = tuple[int, str, str, int, str]  # id, product, category, rating, text


def reviews() -> list[Review]:
    with resources.files("pgembed").joinpath("data/reviews.csv").open(encoding="utf-8") as f:
        return [
            (int(r["id"]), r["product"], r["category"], int(r["rating"]), r["text"])
            for r in csv.DictReader(f)
        ]


def texts() -> list[str]:
    return [review[-1] for review in reviews()]
