"""Kept so `from pgembed.orm import ...` goes on working: the code is pgembed.contrib.sqlalchemy."""

from pgembed.contrib.sqlalchemy import include_name, include_object, model_spec, nearest, similar_to

__all__ = ["include_name", "include_object", "model_spec", "nearest", "similar_to"]
