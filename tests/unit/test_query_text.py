"""What a query text must be, checked before anything connects or loads; and the CLI leaves a
process's signal handlers as it found them."""

from __future__ import annotations

import signal

import pytest
from click.testing import CliRunner

from pgembed import defaults
from pgembed.cli import main
from pgembed.errors import UsageError
from pgembed.search.planner import require_text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        (" \t\n", "empty"),
        ("x" * (defaults.MAX_QUERY_CHARS + 1), "at most"),
        ("battery\x00life", "NUL"),
        ("battery \ud800", "lone surrogate"),
    ],
)
def test_bad_query_texts_are_one_line_usage_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        require_text(text)


def test_a_long_but_allowed_query_text_passes() -> None:
    require_text("é" * defaults.MAX_QUERY_CHARS)


def test_the_cli_restores_the_signal_handlers_it_installs() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    result = CliRunner().invoke(
        main, ["status", "--database-url", "postgresql://bob:hunter2@127.0.0.1:1/x"]
    )
    assert result.exit_code == 1 and "hunter2" not in result.output
    after = {s: signal.getsignal(s) for s in before}
    assert after == before
