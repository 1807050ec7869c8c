"""The click options of the model settings, made from their declaration (lifecycle/options.py):
each passes its value to the command under the setting's name."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import click

from pgembed.lifecycle.options import SETTINGS, Setting

F = Callable[..., Any]


def _option(setting: Setting, alter: bool) -> Callable[[F], F]:
    name, flag = setting.name, setting.option
    help_text = (setting.alter_help or setting.help) if alter else setting.help
    if setting.kind is bool:  # add: the flag that turns its default off; alter: either way
        off = flag.replace("--", "--no-", 1)
        if alter:
            return click.option(f"{flag}/{off}", name, default=None, help=help_text)
        spelt = off if setting.default else flag
        return click.option(
            spelt, name, flag_value=not setting.default, default=setting.default, help=help_text
        )
    kind: click.ParamType[Any] | None = None
    if setting.choices:
        kind = click.Choice(setting.choices)
    elif setting.kind is int:
        kind = click.IntRange(*setting.bounds)
    default = None if alter else setting.default
    show = isinstance(default, str) and default != ""  # as `[default: auto]`; "" says nothing
    return click.option(flag, name, type=kind, default=default, show_default=show, help=help_text)


def setting_options(*, alter: bool, only: Collection[str] = ()) -> Callable[[F], F]:
    """The options of the settings `model alter` (alter) or `model add` takes, in SETTINGS'
    order (`only`: these settings only); alter's default None keeps a setting."""
    chosen = [s for s in SETTINGS if (alter or s.on_add) and (not only or s.name in only)]

    def decorate(command: F) -> F:
        for setting in reversed(chosen):
            command = _option(setting, alter)(command)
        return command

    return decorate


def pop_settings(kw: dict[str, Any]) -> dict[str, Any]:
    """The settings' values, taken out of a command's keyword arguments."""
    return {s.name: kw.pop(s.name) for s in SETTINGS if s.name in kw}
