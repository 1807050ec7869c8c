"""Every setting of a model, declared once (SETTINGS): its type, default, help, CLI spelling,
check, and how the catalog records it.

Made from it: the click options of `model add`, `model alter` and `reindex` (cli/options.py), the
model keywords of `pgembed.add_model` and `alter_model`, the checks of `AddRequest` and
`reindex.Change`, the "same model?" rule of `model add`, and the catalog row of a new model or
version. What mypy must see (the requests' fields, the keywords' TypedDicts) is generated from it
into generated.py: `python -m pgembed.lifecycle` writes it again, and a unit test fails while it
is stale. Adding a setting is an entry here plus its behaviour (docs/decisions.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pgembed import checks, defaults
from pgembed.catalog import registry
from pgembed.catalog.registry import ModelSpec
from pgembed.encode import embedder, precision
from pgembed.lifecycle.generated import ModelSettings, SettingChanges

# How a model's catalog row records the setting: as given; as the loaded checkpoint has it (its
# default None asks for the checkpoint's own); or as precision.choose resolves it (with_precision).
Recorded = Literal["given", "loaded", "checked"]


@dataclass(frozen=True)
class Setting:
    """One setting of a model: what the CLI, the API, the checks and the catalog need to know."""

    name: str  # the field of AddRequest and reindex.Change
    kind: type[str] | type[bool] | type[int]
    default: str | bool | int | None  # model add's; model alter's is None: keep the current
    help: str  # model add's --help (and alter's, unless alter_help)
    alter_help: str | None = None
    keyword: str | None = None  # the API's keyword and the name in checks' messages: name
    flag: str | None = None  # the CLI option: --name, in dashes; a bool: --no-name on add
    choices: tuple[str, ...] = ()
    bounds: tuple[int, int | None] = (1, None)  # an int's
    recorded: Recorded = "given"
    column: str | None = None  # the ModelSpec field that records it: name
    on_add: bool = True  # False: only `model alter` and `reindex` take it

    @property
    def api_name(self) -> str:
        return self.keyword or self.name

    @property
    def option(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def stored(self) -> str:
        return self.column or self.name

    def check(self, value: object) -> None:
        """A value from Python is of the setting's type and range (click checks the CLI's)."""
        if self.choices:
            checks.choice(self.api_name, value, self.choices)
        elif self.kind is bool:
            checks.flag(self.api_name, value)
        elif self.kind is int:
            checks.integer(self.api_name, value, *self.bounds)
        else:
            checks.text(self.api_name, value)

    def matches_any(self, value: object) -> bool:
        """Asked at its default, a setting the catalog resolves (the checkpoint's own pooling,
        precision auto) asks for nothing in particular: any registered value matches."""
        return self.recorded != "given" and value == self.default


SETTINGS = (
    Setting(
        "model_ref",
        str,
        defaults.MODEL,
        "sentence-transformers checkpoint: a known name, a local directory or a hub id.",
        "Another checkpoint: a known name, a local directory or a hub id.",
        keyword="model",
        flag="--model",
    ),
    Setting(
        "pooling",
        str,
        None,
        "Pooling of token vectors. Default: the checkpoint's own.",
        "mean, cls or max.",
        choices=registry.POOLINGS,
        recorded="loaded",
    ),
    Setting(
        "normalize", bool, True, "Keep vectors unnormalised.", "L2-normalise vectors (or not)."
    ),
    Setting(
        "max_seq_length",
        int,
        None,
        "Truncate texts to this many word pieces. Default: the checkpoint's own.",
        "Truncate texts to this many word pieces.",
        recorded="loaded",
    ),
    Setting("query_prefix", str, "", "Text put before every query."),
    Setting("document_prefix", str, "", "Text put before every embedded row."),
    Setting(
        "precision",
        str,
        "auto",
        "Arithmetic of the encoder; kept only if retrieval agrees with fp32 "
        f"(top-10 neighbours of the table's texts, overlap >= {precision.MIN_OVERLAP}).",
        "auto, fp32, bf16 or int8; checked against fp32. Alone it changes no vector: no reindex.",
        choices=precision.REQUESTS,
        recorded="checked",
        column="precision_requested",
    ),
    Setting(
        "long_texts",
        str,
        "truncate",
        "A text longer than the model's window: embed its first window only (truncate), or "
        "every window, a row ranked by its best (chunk; README: Long texts).",
        "Embed a long text's first window only (truncate) or every window (chunk).",
        choices=registry.LONG_TEXTS,
    ),
    Setting(
        "hnsw_m",
        int,
        None,
        "HNSW m (links per node).",
        flag="--m",
        bounds=defaults.HNSW_M_RANGE,
        on_add=False,
    ),
    Setting(
        "hnsw_ef_construction",
        int,
        None,
        "HNSW ef_construction.",
        flag="--ef-construction",
        bounds=defaults.EF_CONSTRUCTION_RANGE,
        on_add=False,
    ),
)


def taken(*, alter: bool) -> Iterator[Setting]:
    """The settings `model alter` (alter) or `model add` takes."""
    return (s for s in SETTINGS if alter or s.on_add)


def check(request: ModelSettings | SettingChanges, *, alter: bool) -> None:
    """Each setting of `request` (an AddRequest, or with `alter` a reindex.Change) is of its type
    and range, before anything is registered. None keeps a setting of a change, and asks for the
    checkpoint's own where that is the default."""
    for setting in taken(alter=alter):
        value = getattr(request, setting.name)
        if not (value is None and (alter or setting.default is None)):
            setting.check(value)


def from_keywords(function: str, given: Mapping[str, object], *, alter: bool) -> dict[str, Any]:
    """The API's keywords -> the request's fields; an unknown keyword is a TypeError, as it is
    for a function that names its keywords."""
    names = {s.api_name: s.name for s in taken(alter=alter)}
    for keyword in given:
        if keyword not in names:
            raise TypeError(f"{function}() got an unexpected keyword argument {keyword!r}")
    return {names[k]: v for k, v in given.items()}


def values(request: ModelSettings | SettingChanges, *, alter: bool = False) -> dict[str, Any]:
    """The settings of an AddRequest (or with `alter` a reindex.Change), by name."""
    return {s.name: getattr(request, s.name) for s in taken(alter=alter)}


def unlike(request: ModelSettings, spec: ModelSpec) -> list[tuple[Setting, Any, Any]]:
    """The settings of `request` (an AddRequest) that model `spec` was not registered with:
    (setting, asked for, registered); see Setting.matches_any."""
    pairs = ((s, getattr(request, s.name), getattr(spec, s.stored)) for s in taken(alter=False))
    return [(s, want, have) for s, want, have in pairs if not s.matches_any(want) and want != have]


def changed(spec: ModelSpec, change: SettingChanges) -> dict[str, Any]:
    """`spec`'s settings with `change` (a reindex.Change) applied: None keeps a value, except
    that with another checkpoint a loaded setting left unset is the new checkpoint's own."""
    new_ref = change.model_ref not in (None, spec.model_ref)

    def current(setting: Setting) -> Any:
        return None if new_ref and setting.recorded == "loaded" else getattr(spec, setting.stored)

    asked = values(change, alter=True)
    return {s.name: current(s) if asked[s.name] is None else asked[s.name] for s in SETTINGS}


def recorded(asked: Mapping[str, Any], info: embedder.ModelInfo) -> dict[str, Any]:
    """The ModelSpec fields of the settings `asked` for a model loaded as `info`: a loaded
    setting as the checkpoint has it; the precision is left to lifecycle.models.with_precision."""
    return {
        s.stored: getattr(info, s.name) if s.recorded == "loaded" else asked[s.name]
        for s in SETTINGS
        if s.name in asked and s.recorded != "checked"
    }


# The generated module: its path, and the source written there.
GENERATED = Path(__file__).with_name("generated.py")
_HEADER = '''"""Generated from options.py by `python -m pgembed.lifecycle`: do not edit.

The static types of the model settings declared there, for mypy: the fields of the requests
(lifecycle.models.AddRequest, lifecycle.reindex.Change) and the keywords of `pgembed.add_model`
and `pgembed.alter_model` (api.ModelOptions, api.AlterOptions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict'''


def _literal(value: object) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _type(setting: Setting, optional: bool) -> str:
    return setting.kind.__name__ + (" | None" if optional else "")


def _block(head: str, doc: str, lines: list[str]) -> str:
    return "\n".join(["", "", "", head, f'    """{doc}"""', "", *(f"    {line}" for line in lines)])


def source() -> str:
    """The text of generated.py for SETTINGS."""
    add = [s for s in SETTINGS if s.on_add]
    blocks = [
        _block(
            "@dataclass(frozen=True, kw_only=True)\nclass ModelSettings:",
            "A model's settings as `model add` takes them (the base of AddRequest).",
            [f"{s.name}: {_type(s, s.default is None)} = {_literal(s.default)}" for s in add],
        ),
        _block(
            "@dataclass(frozen=True, kw_only=True)\nclass SettingChanges:",
            "What `model alter` changes (the base of reindex.Change); None keeps a setting.",
            [f"{s.name}: {_type(s, True)} = None" for s in SETTINGS],
        ),
        _block(
            "class AddKeywords(TypedDict, total=False):",
            "`pgembed.add_model`'s model settings.",
            [
                f"{s.api_name}: {_type(s, s.default is None)}  # default {_literal(s.default)}"
                for s in add
            ],
        ),
        _block(
            "class AlterKeywords(TypedDict, total=False):",
            "`pgembed.alter_model`'s model settings; None (the default) keeps a setting.",
            [f"{s.api_name}: {_type(s, True)}" for s in SETTINGS],
        ),
    ]
    return _HEADER + "".join(blocks) + "\n"


def write() -> None:
    """Write generated.py again (`python -m pgembed.lifecycle`)."""
    GENERATED.write_text(source())
