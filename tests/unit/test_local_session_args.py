"""``local_session`` refuses counts Spark could not use, before it starts anything."""

from __future__ import annotations

from typing import Any

import pytest

from pyspark_abs import local_session
from pyspark_abs.errors import ConfigError


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"cores": 0}, r"cores must be a positive integer, got 0"),
        ({"max_failures": -1}, r"max_failures must be a positive integer, got -1"),
        ({"shuffle_partitions": 0}, r"shuffle_partitions must be a positive integer, got 0"),
        ({"shuffle_partitions": True}, r"shuffle_partitions must be a positive integer, got True"),
        ({"cores": "2"}, r"cores must be a positive integer, got '2'"),
    ],
)
def test_local_session_refuses_a_count_that_is_not_a_positive_integer(
    given: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=f"local_session: {message}"):
        local_session(**given)
