"""Shared fixtures: one local SparkSession for the whole run (helpers are in tests/support)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_abs import testing


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local session with task retries (``local[2,3]``), shared by all Spark tests."""
    log_config = Path(__file__).parents[1] / "conf" / "log4j2.properties"
    session = testing.session(
        conf={"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log_config}"}
    )
    yield session
    session.stop()
