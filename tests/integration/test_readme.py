"""The documentation's quickstart, run as a user would paste it."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from tests.support.docs import block_with


def test_the_quickstart_runs_and_checks_itself(spark: SparkSession) -> None:
    block = block_with("# Quickstart: a three-stage job, a crash and a rollback")
    scope: dict[str, Any] = {"__name__": "quickstart"}
    exec(compile(block, "docs quickstart", "exec"), scope)
    job = scope["job"]
    assert [s.epoch for s in job.snapshots()][-1] == 5
    assert scope["spark"] is spark
