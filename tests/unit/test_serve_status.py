"""The HTTP status serve gives an error raised while answering (serve/api.status_of)."""

from pgembed.errors import DatabaseError
from pgembed.search import plan
from pgembed.serve.api import status_of


def test_a_model_whose_table_changed_is_500_not_a_503_to_retry() -> None:
    said = "model 'minilm' cannot read its table: column t.body does not exist"
    try:
        try:
            raise plan.Undefined("column t.body does not exist")
        except plan.Undefined:
            raise DatabaseError(said) from None  # as planner.plan_for raises it
    except DatabaseError as exc:
        assert status_of(exc) == (500, said)
