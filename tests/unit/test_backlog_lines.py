"""What `sync --once` says of the rows it left in the queue."""

from pgembed.cli.sync import backlog_lines
from pgembed.sync.store import Backlog


def test_rows_left_by_a_run_that_finished_came_in_meanwhile() -> None:
    left = Backlog(
        retrying=0, orphaned=0, orphaned_seconds=0.0, leased=0, held=0, held_seconds=0.0, waiting=44
    )
    assert backlog_lines(left) == ["44 rows came in meanwhile: `pgembed sync --once` again"]


def test_rows_left_by_a_stopped_run_are_said_to_be_still_queued() -> None:
    """Ctrl-C ended it: the rows waiting were queued before it, not meanwhile."""
    left = Backlog(
        retrying=2,
        orphaned=0,
        orphaned_seconds=0.0,
        leased=0,
        held=0,
        held_seconds=0.0,
        waiting=300,
    )
    assert backlog_lines(left, stopped=True) == [
        "2 rows wait for a retry after a failure: see `pgembed status`",
        "stopped: 300 rows still queued: `pgembed sync --once` again",
    ]


def test_rows_an_application_held_are_said_with_when_they_are_tried_again() -> None:
    left = Backlog(
        retrying=0, orphaned=0, orphaned_seconds=0.0, leased=0, held=3, held_seconds=12.4, waiting=0
    )
    assert backlog_lines(left) == [
        "3 rows were locked by another transaction when their vectors were written: "
        "`pgembed sync --once` again when it has ended (they are ready again in 12 s)"
    ]
