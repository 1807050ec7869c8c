"""Every option of `pgembed model add` and `model alter` has its keyword in the Python API: a new
CLI option without one fails here. The model settings are declared once
(pgembed/lifecycle/options.py); the few other names that differ on purpose are mapped below."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import fields
from typing import Any, get_args, get_type_hints

import click
import pytest

import pgembed
from pgembed import api, defaults
from pgembed.catalog.registry import ModelSpec
from pgembed.cli.model import model_add, model_alter
from pgembed.encode import embedder
from pgembed.errors import UsageError
from pgembed.lifecycle import generated, models, options

# A setting's CLI parameter is its field's name; Python's keyword may differ (model_ref: model).
SETTING_NAMES: dict[str, str | None] = {s.name: s.api_name for s in options.SETTINGS}
# CLI parameter name -> the API keyword that does the same (None: no keyword, on purpose).
ADD_NAMES: dict[str, str | None] = {
    **SETTING_NAMES,
    "columns": "column",  # repeated --column; the API takes one name or a sequence
    "database_url": "database_url",
}
ALTER_NAMES: dict[str, str | None] = {
    **SETTING_NAMES,
    "no_wait": "wait",
    "database_url": "database_url",
}


def cli_params(command: click.Command) -> set[str]:
    return {p.name for p in command.params if p.name is not None}


def keywords(function: Callable[..., Any]) -> set[str]:
    """The keywords a function takes: its parameters, and the keys of its **Unpack[TypedDict]."""
    hints = get_type_hints(function, include_extras=True)
    named = set()
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            (typed_dict,) = get_args(hints[parameter.name])
            named |= set(get_type_hints(typed_dict))
        else:
            named.add(parameter.name)
    return named


def mapped(command: click.Command, names: dict[str, str | None]) -> set[str]:
    wanted = {names.get(name, name) for name in cli_params(command)}
    return {name for name in wanted if name is not None}


def test_the_generated_types_are_current() -> None:
    # mypy reads generated.py; a setting declared in options.py but not there is untyped.
    assert options.GENERATED.read_text() == options.source(), (
        "pgembed/lifecycle/generated.py is stale: run `python -m pgembed.lifecycle`"
    )


def test_every_model_add_option_has_an_add_model_keyword() -> None:
    missing = mapped(model_add, ADD_NAMES) - keywords(api.add_model)
    assert not missing, f"pgembed.add_model lacks {sorted(missing)}"
    assert {"long_texts", "backfill", "model", "normalize"} <= keywords(api.add_model)


def test_every_model_alter_option_has_an_alter_model_keyword() -> None:
    missing = mapped(model_alter, ALTER_NAMES) - keywords(api.alter_model)
    assert not missing, f"pgembed.alter_model lacks {sorted(missing)}"
    assert {"long_texts", "hnsw_m", "wait", "device"} <= keywords(api.alter_model)


def test_the_name_maps_name_real_options() -> None:
    # A map entry for an option that no longer exists would hide nothing, but mislead.
    adds = {s.name for s in options.SETTINGS if s.on_add}
    assert set(ADD_NAMES) - (set(SETTING_NAMES) - adds) <= cli_params(model_add)
    assert set(ALTER_NAMES) <= cli_params(model_alter)


def test_the_clients_take_the_same_keywords() -> None:
    # Client.add_model(**ModelOptions) and alter_model(**AlterOptions): the TypedDicts must
    # follow the functions (everything but the positional arguments and the URL).
    add = keywords(api.add_model) - {"name", "table", "column", "database_url"}
    assert set(get_type_hints(api.ModelOptions)) == add
    alter = keywords(api.alter_model) - {"name", "database_url"}
    assert set(get_type_hints(api.AlterOptions)) == alter
    assert "alter_model" in pgembed.__all__


@pytest.mark.parametrize("function", [pgembed.add_model, pgembed.alter_model])
def test_a_misspelled_keyword_is_a_type_error_not_ignored(function: Callable[..., Any]) -> None:
    args = ("m", "t", "c") if function is pgembed.add_model else ("m",)
    with pytest.raises(TypeError, match="long_text'"):
        function(*args, long_text="chunk")
    with pytest.raises(TypeError, match="model_ref"):  # the field's name is not the keyword
        function(*args, model_ref="all-MiniLM-L6-v2")


def test_model_add_defaults_are_the_declared_ones() -> None:
    cli = model_add.make_context("add", ["m", "--table", "t", "--column", "c"]).params
    declared = {s.name: s.default for s in options.SETTINGS if s.on_add}
    assert {name: cli[name] for name in declared} == declared
    request = models.AddRequest("m", "t", "c")
    assert {f.name: getattr(request, f.name) for f in fields(generated.ModelSettings)} == declared


def test_alter_model_defaults_are_the_clis() -> None:
    # A default of its own would build the index differently from Python than from the CLI:
    # maintenance_work_mem was a fixed 1GB here while the CLI sizes it from the table.
    cli = model_alter.make_context("alter", ["m"]).params
    cli["claim_size"] = defaults.REINDEX_CLAIM_SIZE  # the CLI's None, resolved when it runs
    api_defaults = inspect.signature(api.alter_model).parameters
    differ = {}
    for cli_name, cli_default in cli.items():
        api_name = ALTER_NAMES.get(cli_name, cli_name)
        if api_name is None or api_name not in api_defaults or cli_name in {"name", "no_wait"}:
            continue
        if cli_default != api_defaults[api_name].default:
            differ[api_name] = (cli_default, api_defaults[api_name].default)
    assert not differ, f"(CLI, API) defaults differ: {differ}"
    assert api_defaults["wait"].default is (not cli["no_wait"])
    assert all(cli[s.name] is None for s in options.SETTINGS)  # None keeps a setting


def registered(request: models.AddRequest, precision: str) -> ModelSpec:
    """What `model add` registers for `request` (options.recorded) on public.t, keyed by id, with
    a checkpoint of mean pooling and 256 word pieces, and the `precision` it was checked in."""
    info = embedder.ModelInfo(
        dimensions=384, pooling="mean", max_seq_length=256, position_limit=512
    )
    where = ("m", "public", "t", "id", "integer", "c", "embedding_m")
    values = options.recorded(options.values(request), info)
    return ModelSpec(*where, dimensions=384, precision_requested=precision, **values)


def test_a_setting_left_to_the_checkpoint_or_auto_matches_any() -> None:
    spec = registered(models.AddRequest("m", "t", "c"), "bf16")
    assert (spec.pooling, spec.max_seq_length, spec.normalize) == ("mean", 256, True)
    assert models.differences(models.AddRequest("m", "t", "c"), spec) == []
    asked = models.AddRequest(
        "m", "other", "c", pooling="cls", max_seq_length=256, precision="fp32", normalize=False
    )
    found = [(d.option, d.keyword, d.asked, d.registered) for d in models.differences(asked, spec)]
    assert found == [
        ("table", "table", "public.other", "public.t"),
        ("pooling", "pooling", "cls", "mean"),
        ("normalize", "normalize", False, True),
        ("precision", "precision", "fp32", "bf16"),
    ]


def test_a_bad_setting_is_one_line_naming_the_keyword() -> None:
    with pytest.raises(UsageError, match="max_seq_length must be an integer of at least 1"):
        models.AddRequest("m", "t", "c", max_seq_length=0)
    with pytest.raises(UsageError, match="hnsw_m must be an integer from 2 to 100, not 1"):
        pgembed.alter_model("m", hnsw_m=1)
    with pytest.raises(UsageError, match="model must be a string"):
        pgembed.add_model("m", "t", "c", model=3)  # type: ignore[arg-type]
