"""Which PySpark pyspark-abs accepts."""

import pytest

from pyspark_abs.runtime import pyspark_problem


@pytest.mark.parametrize("version", ["4.2.0", "4.3.0", "4.10.1.dev0", "5.0.0"])
def test_pyspark_4_2_and_newer_is_accepted(version: str) -> None:
    assert pyspark_problem(version) is None


@pytest.mark.parametrize(
    ("version", "found"),
    [(None, "and none is installed"), ("4.1.1", "found 4.1.1"), ("3.5.0", "found 3.5.0")],
)
def test_older_or_missing_pyspark_is_refused_with_what_to_do(
    version: str | None, found: str
) -> None:
    problem = pyspark_problem(version)
    assert problem is not None
    assert problem.startswith(f"pyspark-abs needs PySpark 4.2 or newer, {found}: ")
    assert "pip install 'pyspark-abs[spark]'" in problem
