"""Progress bars on a terminal, silence elsewhere; the lines a model's setup prints as it goes."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

import click
from tqdm import tqdm

from pgembed.lifecycle import indexbuild, setup


@contextmanager
def progress_bar(
    total: int | None, description: str, *, enabled: bool = True
) -> Iterator[Callable[[int], None]]:
    """Yield an `advance(n)` function; the bar is drawn only when stderr is a terminal. The total
    is what was known at the start: rows that come in meanwhile (`sync --once` embeds them too)
    and rows tried again raise it, rather than run the bar past 100 %."""
    show = enabled and sys.stderr.isatty()
    with tqdm(total=total, desc=description, unit="rows", disable=not show, leave=True) as bar:
        yield partial(advance, bar)


def advance(bar: tqdm[None], n: int) -> None:
    if bar.total is not None and bar.n + n > bar.total:
        bar.total = bar.n + n
    bar.update(n)


class SetupLines(setup.Reporter):
    """`model add` and a reindex's start on stderr: a line as each step starts (the model's
    load, each precision check, the catalog step, the index build and its phases, the queuing),
    and the queuing's progress every few seconds."""

    def __init__(self, every_seconds: float = 5.0) -> None:
        self._every = every_seconds
        self._last = 0.0
        self._phase: str | None = None

    def step(self, text: str) -> None:
        click.echo(f"{text}…", err=True)

    def queued(self, done: int, estimate: int) -> None:
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            click.echo(f"  {done} of about {estimate} rows looked at", err=True)

    def index(self, sample: indexbuild.BuildProgress) -> None:
        if sample.phase != self._phase:
            self._phase = sample.phase
            click.echo(f"  index build: {describe_build(sample)}", err=True)

    def waiting(self, text: str) -> None:
        click.echo(f"pgembed: {text}", err=True)


def describe_build(sample: indexbuild.BuildProgress) -> str:
    """`building index: loading tuples (1200 of 3000)`: a phase of pg_stat_progress_create_index."""
    counts = f" ({sample.done} of {sample.total})" if sample.total else ""
    return f"{sample.phase}{counts}"
