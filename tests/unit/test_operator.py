import datetime as dt
from typing import Any

import pandas as pd
import pytest

from pyspark_abs import StateEvolution, TimeoutMode, operator, vectorized_operator
from pyspark_abs.errors import OperatorDefinitionError
from pyspark_abs.operators.per_key import PerKeyAdapter


def fn(key: tuple[Any, ...], rows: pd.DataFrame, state: Any) -> None:
    return None


def group_fn(rows: pd.DataFrame, state: pd.DataFrame, ctx: Any) -> None:
    return None


def test_declaration_records_keys_outputs_and_form() -> None:
    op = operator(
        key=["a", "b"],
        state_schema="n long",
        outputs={"x": "a long", "y": "b long"},
        timeout="event_time",
    )(fn)
    assert op.name == "fn"
    assert op.key == ("a", "b")
    assert op.output_names == ("x", "y")
    assert op.timeout is TimeoutMode.EVENT_TIME
    assert isinstance(op.function, PerKeyAdapter)
    assert op.function.function is fn
    assert op.function.key == ("a", "b")
    assert op.function.timeout is TimeoutMode.EVENT_TIME
    vec = vectorized_operator(key="a", state_schema="n long", output_schema="a long", name="v")(
        group_fn
    )
    assert vec.output_names == ("output",)
    assert vec.function is group_fn


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": "a", "state_schema": "n long"}, "exactly one of output_schema"),
        (
            {
                "key": "a",
                "state_schema": "n long",
                "output_schema": "a long",
                "outputs": {"x": "a long"},
            },
            "exactly one of",
        ),
        (
            {"key": [], "state_schema": "n long", "output_schema": "a long"},
            "key must be a column name",
        ),
        (
            {"key": ["a", "a"], "state_schema": "n long", "output_schema": "a long"},
            "key columns repeat",
        ),
        ({"key": "_epoch", "state_schema": "n long", "output_schema": "a long"}, "reserved"),
        (
            {"key": "a", "state_schema": "n long", "output_schema": "a long", "timeout": "weekly"},
            "timeout must be one of",
        ),
        (
            {"key": "a", "state_schema": "n long", "output_schema": "a long", "name": "bad name!"},
            "operator name",
        ),
        ({"key": "a", "state_schema": "n long", "outputs": {}}, "outputs= is empty"),
        (
            {"key": "a", "output_schema": "a long", "timeout": "event_time"},
            r"operator 'fn' is stateless \(no state_schema\), so it can have no timeouts",
        ),
        (
            {"key": "a", "output_schema": "a long", "ttl": dt.timedelta(hours=1)},
            "is stateless",
        ),
        (
            {
                "key": "a",
                "output_schema": "a long",
                "evolution": StateEvolution(migrate=lambda old: old),
            },
            r"evolution= can only drop the state of an earlier stateful version",
        ),
    ],
)
def test_inconsistent_declarations_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(OperatorDefinitionError, match=message):
        operator(**kwargs)(fn)
