"""Which PySpark pyspark-abs accepts, and which features need Spark 4.2."""

import gc
import os

import pytest

from pyspark_abs.runtime import (
    pyspark_problem,
    python_source_problem,
    settle_worker_heap,
    usable_cores,
)


@pytest.mark.parametrize("version", ["4.0.0", "4.1.4", "4.2.0", "4.3.0", "4.10.1.dev0", "5.0.0"])
def test_pyspark_4_0_and_newer_is_accepted(version: str) -> None:
    assert pyspark_problem(version) is None


@pytest.mark.parametrize(
    ("version", "found"),
    [(None, "and none is installed"), ("3.5.7", "found 3.5.7"), ("3.4.0", "found 3.4.0")],
)
def test_older_or_missing_pyspark_is_refused_with_what_to_do(
    version: str | None, found: str
) -> None:
    problem = pyspark_problem(version)
    assert problem is not None
    assert problem.startswith(f"pyspark-abs needs PySpark 4.0 or newer, {found}: ")
    assert "pip install 'pyspark-abs[spark]'" in problem
    assert "Databricks Runtime built on Spark 4.0 (Databricks Runtime 17.3 LTS" in problem


@pytest.mark.parametrize("version", ["4.2.0", "4.3.0", "5.0.0"])
def test_python_sources_run_on_spark_4_2_and_newer(version: str) -> None:
    assert python_source_problem(version, "FileSource", "Use X.") is None


@pytest.mark.parametrize(("version", "dbr"), [("4.0.1", "17.3 LTS"), ("4.1.4", "18 LTS")])
def test_python_sources_on_older_spark_name_the_feature_the_version_and_what_to_use(
    version: str, dbr: str
) -> None:
    problem = python_source_problem(version, "FileSource", "Use spark.readStream.")
    assert problem is not None
    assert problem == (
        f"FileSource needs Spark 4.2 (Databricks Runtime 19 or newer); this session runs "
        f"Spark {version}. Use spark.readStream."
    )


def test_usable_cores_follow_the_affinity_and_fall_back_to_the_count_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """macOS and Windows have no CPU affinity call: the machine's count stands in for it."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert usable_cores() == 3
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert usable_cores() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert usable_cores() == 1


def test_the_heap_is_frozen_only_inside_a_spark_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a task (a driver, a test calling a task itself) the heap is left alone, even
    where Spark reuses workers; the freezing itself is proved in a worker by
    tests/integration/test_pipeline.py."""
    frozen = gc.get_freeze_count()
    monkeypatch.setenv("SPARK_REUSE_WORKER", "1")
    settle_worker_heap()
    assert gc.get_freeze_count() == frozen
