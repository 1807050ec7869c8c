"""The HTTP status serve gives an error raised while answering (serve/api.status_of,
timed_out)."""

from psycopg.errors import QueryCanceled

from pgembed.errors import DatabaseError
from pgembed.search import plan
from pgembed.serve.api import status_of, timed_out


def test_a_model_whose_table_changed_is_500_not_a_503_to_retry() -> None:
    said = "model 'minilm' cannot read its table: column t.body does not exist"
    try:
        try:
            raise plan.Undefined("column t.body does not exist")
        except plan.Undefined:
            raise DatabaseError(said) from None  # as planner.plan_for raises it
    except DatabaseError as exc:
        assert status_of(exc) == (500, said)


def test_the_statement_timeout_is_told_from_a_cancel_in_any_language() -> None:
    """Both are SQLSTATE 57014. In English the message says which; in another lc_messages (the
    embedded server has no translations, so these messages are written here as a German
    server's), a request that ran the limit out is the timeout, a shorter one a cancel."""
    english_timeout = QueryCanceled("canceling statement due to statement timeout")
    english_cancel = QueryCanceled("canceling statement due to user request")
    german = QueryCanceled("storniere Anfrage wegen Zeitüberschreitung einer Anweisung")
    assert timed_out(english_timeout, 0.1, 30)
    assert not timed_out(english_cancel, 31, 30)
    assert timed_out(german, 30.02, 30)
    assert not timed_out(german, 4.0, 30)
    assert not timed_out(german, 99, 0)  # no limit: never the timeout
