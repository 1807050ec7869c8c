"""db.first_line: the one line an error is shown as."""

from pgembed import db


def test_a_long_quoted_value_keeps_its_start() -> None:
    line = db.first_line(Exception(f'value "{"x" * 200}" is out of range\nDETAIL: more'))
    assert line == f'value "{"x" * 60}…" is out of range'


def test_text_between_two_short_quoted_values_is_kept_whole() -> None:
    said = (
        'filter on "rating": true is not a value of its type bigint (invalid input syntax for '
        'type bigint: "true")'
    )
    assert db.first_line(Exception(said)) == said
