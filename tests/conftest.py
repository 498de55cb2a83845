"""Shared fixtures: one local SparkSession for the whole run (helpers are in tests/support)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_abs import testing
from pyspark_abs.storage.spark import spark_reads_delta
from tests.support import timing
from tests.support.kafka import KAFKA_JARS

DELTA_JARS = "ABS_DELTA_JARS"
"""Comma-separated Delta Lake jars for the session (set by scripts/test_spark_versions)."""
_UNIT_TESTS = Path(__file__).parent / "unit"
_DURATIONS: list[tuple[str, float]] = []
_STARTED = time.monotonic()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests under ``tests/unit`` ``unit`` (the fast lane selects them so)."""
    for item in items:
        if item.path.is_relative_to(_UNIT_TESTS):
            item.add_marker(pytest.mark.unit)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each phase's time, on the process that prints the summary (xdist sends it there)."""
    _DURATIONS.append((report.nodeid, report.duration))


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The ten slowest test files, those over the budget of one, and the run's wall time."""
    if _DURATIONS and not hasattr(terminalreporter.config, "workerinput"):
        wall_s = time.monotonic() - _STARTED
        for line in timing.report(timing.file_seconds(_DURATIONS), wall_s):
            terminalreporter.write_line(line)


@pytest.fixture(scope="session", autouse=True)
def temporary_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One temporary directory for the run, removed after it: the default
    ``local_state_dir`` is the executor's, so the live state of every test's roots goes there.

    Set before the session starts, so that its Python workers and the tests' child
    programs inherit it.
    """
    folder = tmp_path_factory.mktemp("tmpdir")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TMPDIR", str(folder))
        env.setattr(tempfile, "tempdir", None)
        yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def spark(temporary_directory: Path) -> Iterator[SparkSession]:
    """A local session with task retries (``local[2,3]``), shared by all Spark tests.

    With ``ABS_DELTA_JARS``, Delta Lake's jars, SQL extension and catalog are configured;
    with ``ABS_KAFKA_JARS``, Spark's Kafka connector.
    """
    log_config = Path(__file__).parents[1] / "conf" / "log4j2.properties"
    conf = {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log_config}"}
    jars = [os.environ[name] for name in (DELTA_JARS, KAFKA_JARS) if os.environ.get(name)]
    if jars:
        conf["spark.jars"] = ",".join(jars)
    if os.environ.get(DELTA_JARS):
        conf.update(
            {
                "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
                "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
                # Delta replays a table's log in 50 tasks by default: slow for small tables
                "spark.databricks.delta.snapshotPartitions": "2",
            }
        )
    session = testing.session(conf=conf)
    yield session
    session.stop()


@pytest.fixture
def delta_spark(spark: SparkSession) -> SparkSession:
    """The session, when it reads ``format("delta")`` with Delta Lake's jars."""
    if not spark_reads_delta(spark):
        pytest.skip("no Delta Lake jars on this session (no Delta release for this Spark)")
    return spark
