"""Checks of option values that arrive from Python rather than through the CLI's click types.

One line (UsageError) naming the option, made before anything is registered: a value the
database refuses later would leave a half-done model or reindex behind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from numbers import Integral, Real
from typing import TypeVar

from pgembed.errors import UsageError

T = TypeVar("T")


def integer(name: str, value: object, low: int, high: int | None = None) -> int:
    """An int (numpy's too, not a bool) from low to high."""
    bounds = f"from {low} to {high}" if high is not None else f"of at least {low}"
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise UsageError(f"{name} must be an integer {bounds}, not {shown(value)}")
    number = int(value)
    if number < low or (high is not None and number > high):
        raise UsageError(f"{name} must be an integer {bounds}, not {number}")
    return number


def number(name: str, value: object, low: float, high: float | None = None) -> float:
    bounds = f"from {low:g} to {high:g}" if high is not None else f"of at least {low:g}"
    if (
        isinstance(value, bool)
        or not isinstance(value, Real)
        or not float(value) >= low
        or (high is not None and not float(value) <= high)
    ):
        raise UsageError(f"{name} must be a number {bounds}, not {shown(value)}")
    return float(value)


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False, not {shown(value)}")
    return value


def text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise UsageError(f"{name} must be a string, not {shown(value)}")
    return value


def choice(name: str, value: T, options: Sequence[T]) -> T:
    if value not in options:
        listed = ", ".join(repr(o) for o in options)
        raise UsageError(f"{name} must be one of {listed}, not {shown(value)}")
    return value


def one_of(options: Sequence[str]) -> Callable[[str, object], object]:
    """`choice` of these options, as a check of a name and a value."""
    return lambda name, value: choice(name, value, options)


def shown(value: object, limit: int = 60) -> str:
    """A value for a message: its repr, cut short, with its type when that is the problem."""
    text = repr(value)
    cut = text if len(text) <= limit else text[: limit - 1] + "…"
    return cut if isinstance(value, str | int | float) else f"{cut} ({type(value).__name__})"
