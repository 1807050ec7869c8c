"""Generated from options.py by `python -m pgembed.lifecycle`: do not edit.

The static types of the model settings declared there, for mypy: the fields of the requests
(lifecycle.models.AddRequest, lifecycle.reindex.Change) and the keywords of `pgembed.add_model`
and `pgembed.alter_model` (api.ModelOptions, api.AlterOptions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """A model's settings as `model add` takes them (the base of AddRequest)."""

    model_ref: str = "all-MiniLM-L6-v2"
    pooling: str | None = None
    normalize: bool = True
    max_seq_length: int | None = None
    query_prefix: str = ""
    document_prefix: str = ""
    precision: str = "auto"
    long_texts: str = "truncate"


@dataclass(frozen=True, kw_only=True)
class SettingChanges:
    """What `model alter` changes (the base of reindex.Change); None keeps a setting."""

    model_ref: str | None = None
    pooling: str | None = None
    normalize: bool | None = None
    max_seq_length: int | None = None
    query_prefix: str | None = None
    document_prefix: str | None = None
    precision: str | None = None
    long_texts: str | None = None
    hnsw_m: int | None = None
    hnsw_ef_construction: int | None = None


class AddKeywords(TypedDict, total=False):
    """`pgembed.add_model`'s model settings."""

    model: str  # default "all-MiniLM-L6-v2"
    pooling: str | None  # default None
    normalize: bool  # default True
    max_seq_length: int | None  # default None
    query_prefix: str  # default ""
    document_prefix: str  # default ""
    precision: str  # default "auto"
    long_texts: str  # default "truncate"


class AlterKeywords(TypedDict, total=False):
    """`pgembed.alter_model`'s model settings; None (the default) keeps a setting."""

    model: str | None
    pooling: str | None
    normalize: bool | None
    max_seq_length: int | None
    query_prefix: str | None
    document_prefix: str | None
    precision: str | None
    long_texts: str | None
    hnsw_m: int | None
    hnsw_ef_construction: int | None
