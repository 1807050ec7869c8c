"""Names users give are checked whole: a trailing newline is not a valid name."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pgembed.catalog import naming
from pgembed.catalog.registry import ModelSpec
from pgembed.errors import UsageError


@pytest.mark.parametrize("name", ["abc\n", "abc\n\n", "\nabc", "abc\r", "ab c", "abc\x00"])
def test_model_names_with_newlines_or_spaces_are_refused(name: str) -> None:
    with pytest.raises(UsageError, match="invalid model name"):
        naming.model_name(name)


@pytest.mark.parametrize("name", ["reviews\n", "body\n", "re\nviews"])
def test_identifiers_with_newlines_are_refused(name: str) -> None:
    with pytest.raises(UsageError, match="invalid column name"):
        naming.identifier("column", name)
    with pytest.raises(UsageError, match="invalid table name"):
        naming.parse_table(f"public.{name}")


def test_plain_names_pass() -> None:
    assert naming.model_name("minilm_2") == "minilm_2"
    assert naming.identifier("column", "Body$1") == "Body$1"
    assert naming.parse_table("shop.reviews") == ("shop", "reviews")


@pytest.mark.parametrize("key_type", ["integer\n", "text\n", "uuid; drop"])
def test_key_types_with_a_trailing_newline_are_refused(key_type: str) -> None:
    spec = ModelSpec(
        name="m",
        table_schema="public",
        table_name="t",
        key_column="id",
        key_type=key_type,
        text_column="body",
        embedding_column="embedding_m",
        model_ref="all-MiniLM-L6-v2",
        pooling="mean",
        normalize=True,
        dimensions=384,
        max_seq_length=256,
    )
    with pytest.raises(UsageError, match="unsupported key column type"):
        naming.key_type(spec)
    plain = replace(spec, key_type="character varying(20)")
    assert naming.key_type(plain).as_string() == "character varying(20)"
