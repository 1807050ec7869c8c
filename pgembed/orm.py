"""Kept so `from pgembed.orm import ...` goes on working: the code is pgembed.contrib.sqlalchemy."""

from pgembed.contrib.sqlalchemy import (
    SCHEMA,
    include_name,
    include_object,
    model_spec,
    nearest,
    neighbours,
    similar_to,
)

__all__ = [
    "SCHEMA",
    "include_name",
    "include_object",
    "model_spec",
    "nearest",
    "neighbours",
    "similar_to",
]
