"""Every option of `pgembed model add` and `model alter` has its keyword in the Python API: a new
CLI option without one fails here. The few names that differ on purpose are mapped below."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, get_type_hints

import click

import pgembed
from pgembed import api, defaults
from pgembed.cli.model import model_add, model_alter

# CLI parameter name -> the API keyword that does the same (None: no keyword, on purpose).
ADD_NAMES: dict[str, str | None] = {
    "columns": "column",  # repeated --column; the API takes one name or a sequence
    "model_ref": "model",
    "no_normalize": "normalize",  # a flag that turns it off; the API's bool says it directly
    "precision_": "precision",  # the trailing _ only keeps the CLI from shadowing a module
    "database_url": "database_url",
}
ALTER_NAMES: dict[str, str | None] = {
    "model_ref": "model",
    "precision_": "precision",
    "m": "hnsw_m",  # --m and --ef-construction are HNSW's; Python names them so
    "ef_construction": "hnsw_ef_construction",
    "no_wait": "wait",
    "database_url": "database_url",
}


def cli_params(command: click.Command) -> set[str]:
    return {p.name for p in command.params if p.name is not None}


def keywords(function: Callable[..., Any]) -> set[str]:
    return set(inspect.signature(function).parameters)


def mapped(command: click.Command, names: dict[str, str | None]) -> set[str]:
    wanted = {names.get(name, name) for name in cli_params(command)}
    return {name for name in wanted if name is not None}


def test_every_model_add_option_has_an_add_model_keyword() -> None:
    missing = mapped(model_add, ADD_NAMES) - keywords(api.add_model)
    assert not missing, f"pgembed.add_model lacks {sorted(missing)}"
    assert {"long_texts", "backfill"} <= keywords(api.add_model)


def test_every_model_alter_option_has_an_alter_model_keyword() -> None:
    missing = mapped(model_alter, ALTER_NAMES) - keywords(api.alter_model)
    assert not missing, f"pgembed.alter_model lacks {sorted(missing)}"
    assert {"long_texts", "hnsw_m", "wait", "device"} <= keywords(api.alter_model)


def test_the_name_maps_name_real_options() -> None:
    # A map entry for an option that no longer exists would hide nothing, but mislead.
    assert set(ADD_NAMES) <= cli_params(model_add)
    assert set(ALTER_NAMES) <= cli_params(model_alter)


def test_the_clients_take_the_same_keywords() -> None:
    # Client.add_model(**ModelOptions) and alter_model(**AlterOptions): the TypedDicts must
    # follow the functions (everything but the positional arguments and the URL).
    add = keywords(api.add_model) - {"name", "table", "column", "database_url"}
    assert set(get_type_hints(api.ModelOptions)) == add
    alter = keywords(api.alter_model) - {"name", "database_url"}
    assert set(get_type_hints(api.AlterOptions)) == alter
    assert "alter_model" in pgembed.__all__


def test_a_misspelled_keyword_is_a_type_error_not_ignored() -> None:
    try:
        pgembed.add_model("m", "t", "c", long_text="chunk")  # type: ignore[call-arg]
    except TypeError as exc:
        assert "long_text" in str(exc)
    else:
        raise AssertionError("add_model accepted an unknown keyword")


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
