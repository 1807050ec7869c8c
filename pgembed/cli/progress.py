"""Progress bars on a terminal, silence elsewhere."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm import tqdm


@contextmanager
def progress_bar(
    total: int | None, description: str, *, enabled: bool = True
) -> Iterator[Callable[[int], None]]:
    """Yield an `advance(n)` function; the bar is drawn only when stderr is a terminal."""
    show = enabled and sys.stderr.isatty()
    with tqdm(total=total, desc=description, unit="rows", disable=not show, leave=True) as bar:
        yield bar.update
