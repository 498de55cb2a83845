"""Test helpers for pipelines: a local session for pytest and chispa-based snapshot assertions.

Use them in your own tests::

    import pytest
    from pyspark_abs import testing

    @pytest.fixture(scope="session")
    def spark():
        session = testing.session()
        yield session
        session.stop()

    def test_counts(spark, tmp_path):
        build_pipeline(spark, tmp_path).run()
        expected = spark.createDataFrame([("a", 2)], "word string, count long")
        testing.assert_state_equal(tmp_path / "root", "word_count", expected)

The assertions compare with :func:`chispa.assert_df_equality`, ignoring row order and
nullability; chispa comes with ``pip install pyspark-abs[test]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark_abs.errors import ConfigError
from pyspark_abs.session import local_session
from pyspark_abs.snapshots.reading import Snapshots

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def session(
    app_name: str = "pyspark-abs-tests", *, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A local session for tests: 2 cores, task retries on, 2 shuffle partitions, quiet log."""
    return local_session(app_name, cores=2, max_failures=3, shuffle_partitions=2, conf=conf)


def assert_state_equal(
    root: str | Path, operator: str, expected: DataFrame, *, epoch: int | None = None
) -> None:
    """Assert that an operator's state as of ``epoch`` (default: newest) equals ``expected``.

    ``expected`` has the key and state columns.
    """
    snapshots = Snapshots(str(root), expected.sparkSession)
    _assert_equal(snapshots.state(operator, epoch), expected)


def assert_sink_equal(
    root: str | Path, output: str, expected: DataFrame, *, epoch: int | None = None
) -> None:
    """Assert that an output's sink table as of ``epoch`` (default: newest) equals ``expected``."""
    snapshots = Snapshots(str(root), expected.sparkSession)
    _assert_equal(snapshots.sink(output, epoch), expected)


def assert_in_flight_equal(
    root: str | Path, edge: str, expected: DataFrame, *, epoch: int | None = None
) -> None:
    """Assert that the records in flight on a back-edge in a snapshot equal ``expected``."""
    snapshots = Snapshots(str(root), expected.sparkSession)
    _assert_equal(snapshots.in_flight(edge, epoch), expected)


def _assert_equal(actual: DataFrame, expected: DataFrame) -> None:
    try:
        from chispa import assert_df_equality
    except ImportError:
        raise ConfigError(
            "pyspark_abs.testing needs chispa: pip install 'pyspark-abs[test]' or chispa"
        ) from None
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
