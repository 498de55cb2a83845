"""Cyclic dataflows: back-edge logs, quiescence, crashes and restores with records in flight."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from chispa import DataFramesNotEqualError
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pyspark_abs import AbsConfig, BackEdge, Pipeline, Snapshots, cli, restore, rollback, testing
from pyspark_abs.errors import ConfigError, InjectedFault, OperatorDefinitionError, QuiescenceError
from pyspark_abs.examples import components, retry
from pyspark_abs.faults import Fault, FaultStep
from pyspark_abs.sources import DeltaSource
from pyspark_abs.upkeep.retention import vacuum
from pyspark_abs.upkeep.validation import validate
from tests.support.pipelines import assert_same


def expected_components(spark: SparkSession, edges: pa.Table) -> DataFrame:
    labels = sorted(components.union_find(edges).items())
    return spark.createDataFrame(labels, "vertex long, label long")


def found_components(spark: SparkSession, root: Path) -> DataFrame:
    return Snapshots(str(root), spark).state("propagate").select("vertex", "label")


def components_pipeline(
    spark: SparkSession, base: Path, edges: pa.Table, root: Path, **options: Any
) -> Pipeline:
    table = base / "edges"
    if not table.exists():
        components.write_edges(edges, str(table))
    settings: dict[str, Any] = {"key_groups": 8, "commit_mode": "async"}
    settings.update(options.pop("config", {}))
    return components.build(spark, str(table), str(root), config=AbsConfig(**settings), **options)


@pytest.mark.parametrize(
    ("shape", "size", "per_epoch", "compact_every"),
    [("mixed", 18, None, 0), ("random", 40, 12, 1)],
)
def test_components_equal_union_find(
    spark: SparkSession,
    tmp_path: Path,
    shape: str,
    size: int,
    per_epoch: int | None,
    compact_every: int,
) -> None:
    edges = components.generate(shape, size, seed=size)
    root = tmp_path / "root"
    pipeline = components_pipeline(
        spark,
        tmp_path,
        edges,
        root,
        edges_per_epoch=per_epoch,
        config={"compaction_every_epochs": compact_every},
    )
    outcome = pipeline.run_until_quiescent(max_epochs=50)
    if compact_every:  # the log was truncated in the background while the loop ran
        produced = sum(s.rows.get("backedge/offers", 0) for s in Snapshots(str(root)).list())
        live = DeltaTable(str(root / "backedge" / "offers")).to_pyarrow_table().num_rows
        assert live < produced

    expected = expected_components(spark, edges)
    assert_same(found_components(spark, root), expected)
    labels = Snapshots(str(root), spark).sink("labels")
    assert_same(labels.groupBy("vertex").agg(F.min("label").alias("label")), expected)
    snapshots = Snapshots(str(root), spark)
    latest = snapshots.latest()
    assert latest is not None
    assert outcome.epoch == latest.epoch
    assert snapshots.in_flight_table("offers").num_rows == 0
    assert validate(str(root)) == []


def test_quiescence_bound_then_restore_elsewhere_and_rollback(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edges = components.generate("random", 60, seed=3)
    expected = expected_components(spark, edges)
    root = tmp_path / "root"
    with pytest.raises(QuiescenceError, match=r"within 3 epochs .* epoch 3 was not started"):
        components_pipeline(spark, tmp_path, edges, root, edges_per_epoch=20).run_until_quiescent(
            max_epochs=3
        )
    snapshots = Snapshots(str(root), spark)
    assert [s.epoch for s in snapshots.list()] == [0, 1, 2]
    in_flight = snapshots.in_flight("offers", 1)
    assert in_flight.count() > 0, "epoch 1 should have offers in flight"
    capsys.readouterr()
    assert cli.main(["describe", str(root), "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["in_flight"] == {"offers": in_flight.count()}

    # Restore epoch 1 into a new root and run it with 3 partitions and 5 key groups.
    copy = tmp_path / "copy"
    restore(str(root), 1, into=str(copy))
    testing.assert_in_flight_equal(copy, "offers", in_flight, epoch=1)
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        restored = components_pipeline(
            spark, tmp_path, edges, copy, edges_per_epoch=20, config={"key_groups": 5}
        )
        restored.run_until_quiescent(max_epochs=50)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
    assert_same(found_components(spark, copy), expected)

    # Roll the original back to epoch 1 and finish it with its usual checkpoint location.
    rolled = rollback(str(root), 1)
    assert Snapshots(str(root), spark).in_flight_table("offers", rolled.epoch).num_rows == (
        in_flight.count()
    )
    components_pipeline(spark, tmp_path, edges, root, edges_per_epoch=20).run_until_quiescent()
    assert_same(found_components(spark, root), expected)
    assert validate(str(root)) == []


def log_files(uri: str) -> set[str]:
    return {str(p) for p in pa.table(DeltaTable(uri).get_add_actions(flatten=True))["path"]}


def test_compaction_truncates_the_consumed_log_and_vacuum_deletes_it(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edges = components.generate("random", 40, seed=5)
    root = tmp_path / "root"
    log = str(root / "backedge" / "offers")
    sync = {"commit_mode": "sync"}  # each epoch reads the offers of the one before

    def pipeline() -> Pipeline:
        return components_pipeline(spark, tmp_path, edges, root, edges_per_epoch=12, config=sync)

    with pytest.raises(QuiescenceError):
        pipeline().run_until_quiescent(max_epochs=4)
    in_flight = Snapshots(str(root), spark).in_flight("offers", 2)
    produced, files = DeltaTable(log).to_pyarrow_table().num_rows, log_files(log)

    capsys.readouterr()
    assert cli.main(["compact", str(root)]) == 0
    found = re.search(
        r"backedge/offers: removed (\d+) consumed records in \d+ files as of epoch 3",
        capsys.readouterr().out,
    )
    assert found, "the log should have records epoch 3 had consumed"
    removed = files - log_files(log)
    assert removed
    assert DeltaTable(log).to_pyarrow_table().num_rows == produced - int(found.group(1))
    # Epoch 2's records in flight stay readable: its table version references the files.
    assert not set(vacuum(str(root), min_age_seconds=0).deleted.get("backedge/offers", []))
    testing.assert_in_flight_equal(root, "offers", in_flight, epoch=2)
    assert validate(str(root)) == []

    # The loop head skips the truncation; rolled back to epoch 2, its records replay once.
    expected = expected_components(spark, edges)
    pipeline().run_until_quiescent(max_epochs=50)
    assert_same(found_components(spark, root), expected)
    rollback(str(root), 2)
    pipeline().run_until_quiescent(max_epochs=50)
    assert_same(found_components(spark, root), expected)
    report = vacuum(str(root), keep_last=1, min_age_seconds=0)
    assert removed <= set(report.deleted["backedge/offers"])
    assert not any((root / "backedge" / "offers" / path).exists() for path in removed)
    assert validate(str(root)) == []


def expected_jobs(spark: SparkSession, jobs: int, max_attempts: int) -> tuple[DataFrame, ...]:
    outcome = retry.expected_outcome(range(jobs), max_attempts)
    done = [(j, f"job-{j}", n) for j, (kind, n) in outcome.items() if kind == "done"]
    dead = [
        (j, f"job-{j}", n, f"service failed {n} time(s)")
        for j, (kind, n) in outcome.items()
        if kind == "dead_letter"
    ]
    state = [(j, n) for j, (_, n) in outcome.items()]
    return (
        spark.createDataFrame(done, "job_id long, payload string, attempts int"),
        spark.createDataFrame(dead, "job_id long, payload string, attempts int, error string"),
        spark.createDataFrame(state, "job_id long, attempts int"),
    )


def assert_jobs_exactly_once(spark: SparkSession, root: Path, jobs: int) -> None:
    """Every job is done or dead-lettered once, after exactly its attempts; validate passes."""
    done, dead, state = expected_jobs(spark, jobs, max_attempts=3)
    testing.assert_sink_equal(root, "done", done)
    testing.assert_sink_equal(root, "dead_letter", dead)
    testing.assert_state_equal(root, "attempt_job", state)
    assert Snapshots(str(root)).in_flight_table("retry").num_rows == 0
    assert validate(str(root)) == []


JOBS = 12
LOOP_FAULTS = [
    Fault(FaultStep.PRECOMMIT_TASK, epoch=1),
    Fault(FaultStep.AFTER_ALIGN, epoch=1),
    Fault(FaultStep.AFTER_PREPARED, epoch=1),
    Fault(FaultStep.BETWEEN_TABLE_COMMITS, epoch=1),
    Fault(FaultStep.AFTER_COMMITTED, epoch=1),
]
"""Epoch 1 consumes the retries of epoch 0 and sends retries of its own."""


@pytest.mark.parametrize("fault", LOOP_FAULTS, ids=lambda f: f.step.value)
def test_crash_with_records_in_flight_loses_and_repeats_nothing(
    spark: SparkSession, tmp_path: Path, fault: Fault
) -> None:
    jobs = str(tmp_path / "jobs")
    retry.write_jobs(jobs, JOBS)
    root = tmp_path / "root"
    config = AbsConfig(key_groups=4, commit_mode="async")
    crashing = retry.build(spark, jobs, str(root), config=replace(config, faults=(fault,)))
    if fault.step is FaultStep.PRECOMMIT_TASK:
        crashing.run_until_quiescent()  # Spark retries the task; its orphans stay uncommitted
    else:
        with pytest.raises(InjectedFault, match=f"'{fault.step.value}' of epoch 1"):
            crashing.run_until_quiescent()
        assert Snapshots(str(root)).in_flight_table("retry", 0).num_rows > 0
        retry.build(spark, jobs, str(root), config=config).run_until_quiescent()
    assert_jobs_exactly_once(spark, root, JOBS)


def test_write_state_keeps_records_in_flight(spark: SparkSession, tmp_path: Path) -> None:
    from pyspark_abs import write_state

    jobs = str(tmp_path / "jobs")
    retry.write_jobs(jobs, JOBS)
    root = tmp_path / "root"
    config = AbsConfig(key_groups=4, commit_mode="sync")
    with pytest.raises(QuiescenceError):
        retry.build(spark, jobs, str(root), config=config).run_until_quiescent(max_epochs=1)
    snapshots = Snapshots(str(root), spark)
    before = snapshots.in_flight("retry", 0)
    state = snapshots.state("attempt_job")
    info = write_state(state, str(root), retry.retry_operator(3), config=config)
    testing.assert_in_flight_equal(root, "retry", before, epoch=info.epoch)
    with pytest.raises(DataFramesNotEqualError):
        testing.assert_in_flight_equal(root, "retry", before.limit(1), epoch=info.epoch)
    retry.build(spark, jobs, str(root), config=config).run_until_quiescent()
    assert_jobs_exactly_once(spark, root, JOBS)


def test_back_edge_declarations_are_checked(spark: SparkSession, tmp_path: Path) -> None:
    table = str(tmp_path / "jobs")
    retry.write_jobs(table, 1)
    op = retry.retry_operator(3)
    sinks = {"done": str(tmp_path / "d"), "dead_letter": str(tmp_path / "x")}

    def retyped(df: DataFrame) -> DataFrame:
        return df.withColumn("attempt", F.lit(1).cast("long"))

    def pipeline(**options: Any) -> Pipeline:
        settings: dict[str, Any] = {
            "sinks": sinks,
            "back_edges": [BackEdge("retry")],
            "transform": retry.first_attempt,
        }
        settings.update(options)
        return Pipeline("loops", DeltaSource(table), op, root=str(tmp_path / "r"), **settings)

    with pytest.raises(OperatorDefinitionError, match=r"loops output 'nope'.*outputs are"):
        pipeline(back_edges=[BackEdge("nope")])
    with pytest.raises(OperatorDefinitionError, match=r"'retry' loops back .* also has a sink"):
        pipeline(sinks={**sinks, "retry": str(tmp_path / "y")})
    with pytest.raises(OperatorDefinitionError, match="declared twice"):
        pipeline(back_edges=[BackEdge("retry"), BackEdge("retry", name="again")])
    with pytest.raises(OperatorDefinitionError, match="back-edge id 'a/b'"):
        pipeline(back_edges=[BackEdge("retry", name="a/b")])
    with pytest.raises(OperatorDefinitionError, match=r"column types differ: \['attempt: int64"):
        pipeline(
            back_edges=[
                BackEdge(
                    "retry", transform=lambda df: df.withColumn("attempt", F.lit(1).cast("long"))
                )
            ]
        )
    with pytest.raises(OperatorDefinitionError, match=r"key column\(s\) \['job_id'\] are missing"):
        pipeline(back_edges=[BackEdge("retry", transform=lambda df: df.drop("job_id"))])
    with pytest.raises(OperatorDefinitionError, match=r"\['extra'\] are not input columns"):
        pipeline(
            back_edges=[BackEdge("retry", transform=lambda df: df.withColumn("extra", F.lit(1)))]
        )
    with pytest.raises(ConfigError, match="back-edges need snapshots"):
        pipeline(config=AbsConfig(snapshots=False))
    with pytest.raises(ConfigError, match="max_epochs must be a positive integer"):
        pipeline().run_until_quiescent(max_epochs=0)
