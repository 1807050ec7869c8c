"""A progress bar's total grows with rows that came in after it was counted (`sync --once` embeds
them too): the bar never runs past its total."""

from __future__ import annotations

import io

from tqdm import tqdm

from pgembed.cli.progress import advance


def test_rows_beyond_the_total_raise_it() -> None:
    drawn = io.StringIO()
    with tqdm(total=100, file=drawn, unit="rows") as bar:
        advance(bar, 60)
        assert (bar.n, bar.total) == (60, 100)
        advance(bar, 60)  # 20 rows more than were queued at the start
        assert (bar.n, bar.total) == (120, 120)
    assert "120/120" in drawn.getvalue()
    with tqdm(total=None, file=io.StringIO()) as unknown:
        advance(unknown, 5)
        assert (unknown.n, unknown.total) == (5, None)
