"""A mistyped model name: "did you mean" the catalog's close names (registry.unknown), the one
wording the CLI, the Python API and `pgembed serve` all give."""

from __future__ import annotations

from pgembed.catalog import registry
from pgembed.errors import NotFoundError

NAMES = ["demo_cls", "demo_mean", "minilm", "notes"]


def message(name: str, names: list[str] = NAMES) -> str:
    error = registry.unknown(name, names)
    assert isinstance(error, NotFoundError)
    return str(error)


def test_a_typo_gets_the_close_names() -> None:
    assert message("minlm") == (
        "unknown model 'minlm': did you mean 'minilm'? (see `pgembed model list`)"
    )
    assert message("demo_men") == (
        "unknown model 'demo_men': did you mean 'demo_mean' or 'demo_cls'? "
        "(see `pgembed model list`)"
    )


def test_case_is_ignored_and_the_catalogs_spelling_shown() -> None:
    assert "did you mean 'minilm'?" in message("MiniLM")


def test_a_name_like_none_gets_no_guess() -> None:
    assert message("ghost") == "unknown model 'ghost': see `pgembed model list`"
    assert message("minilm", []) == "unknown model 'minilm': see `pgembed model list`"


def test_where_to_look_is_the_callers() -> None:
    error = registry.unknown("minlm", ["minilm"], "this server serves minilm")
    assert str(error) == "unknown model 'minlm': did you mean 'minilm'? (this server serves minilm)"
