"""Jobs: stages joined by channels, snapshotted, killed, rolled back and refused as a whole.

Every test runs the medallion job (bronze → silver → gold, and the fan-in audit over bronze
and silver) and checks each job snapshot against a model computed from the input files
alone (:mod:`tests.support.jobs`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_abs import (
    AbsConfig,
    AbsError,
    ChannelSource,
    Job,
    Pipeline,
    Snapshots,
    rollback,
    untag,
    vacuum,
)
from pyspark_abs.cli import main as cli
from pyspark_abs.errors import (
    ConfigError,
    FencingError,
    InjectedFault,
    OperatorDefinitionError,
    SnapshotNotFoundError,
    SourceError,
    UpstreamNotReadyError,
)
from pyspark_abs.examples import medallion
from pyspark_abs.faults import EXIT_CODE, Fault, FaultStep
from pyspark_abs.job_ledger.manifest import DecisionStatus, open_job
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.compaction import compact
from tests.support.jobs import FILES, assert_job_matches, job_of, run_streaming
from tests.support.pipelines import assert_same

ALL = {n: n for n in range(len(FILES))}
"""A failure-free run: job snapshot n has read files 0..n."""


@pytest.mark.smoke
def test_every_job_snapshot_is_the_cut_the_input_gives(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    medallion.write_events(tmp_path / "in", FILES)
    job = job_of(spark, tmp_path)
    caplog.set_level(logging.INFO, logger="pyspark_abs")
    query = job.start(available_now=True)
    running = [query.is_active]
    assert query.await_termination(timeout=0) is False
    assert query.await_termination(timeout=600)
    running.append(query.is_active)
    assert running == [True, False]
    named = [
        (getattr(r, "pipeline", None), r.getMessage())
        for r in caplog.records
        if r.name.startswith("pyspark_abs")
    ]
    assert {stage for stage, _ in named} == set(job.stages)
    assert all(line.startswith(f"[{stage}] ") for stage, line in named)
    assert_job_matches(spark, job, ALL)
    # a channel as of a job snapshot: silver's sink holds each event once, up to that epoch
    first: dict[str, tuple[str, str, int]] = {}
    for events in FILES[:4]:
        for event in events:
            first.setdefault(event[0], event)
    assert_same(
        job.sink("silver", epoch=3),
        spark.createDataFrame(list(first.values()), medallion.EVENT_DDL),
    )
    views = job.create_views(1)
    assert "audit_state" in views
    totals = spark.sql("SELECT user, total FROM gold_state")
    assert_same(totals, spark.createDataFrame([("ann", 6), ("bob", 7)], "user string, total long"))


KILLS = [
    ("bronze", Fault(FaultStep.AFTER_PREPARED, epoch=1)),
    ("silver", Fault(FaultStep.BETWEEN_TABLE_COMMITS, epoch=3)),
    ("gold", Fault(FaultStep.AFTER_COMMITTED, epoch=1)),
    ("audit", Fault(FaultStep.PRECOMMIT_TASK, epoch=3, attempt=None)),
]
"""Each stage once, each kind of step once: a task, the decision, the commit, after it."""


@pytest.mark.parametrize(("stage", "fault"), KILLS, ids=[f"{s}-{f.step.value}" for s, f in KILLS])
def test_a_fault_in_any_stage_then_a_restart_gives_the_failure_free_job_snapshots(
    spark: SparkSession, tmp_path: Path, stage: str, fault: Fault
) -> None:
    medallion.write_events(tmp_path / "in", FILES)
    faulty = AbsConfig(key_groups=4, commit_mode="sync", faults=(fault,))
    with pytest.raises(AbsError):
        job_of(spark, tmp_path, stage_configs={stage: faulty}).run()
    job = job_of(spark, tmp_path)
    job.run()
    assert_job_matches(spark, job, ALL)


def test_the_whole_application_killed_mid_epoch_recovers_every_stage(
    spark: SparkSession, tmp_path: Path
) -> None:
    medallion.write_events(tmp_path / "in", FILES)
    command = [
        sys.executable,
        "-m",
        "pyspark_abs.examples.medallion",
        "--input",
        str(tmp_path / "in"),
        "--root",
        str(tmp_path / "job"),
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    first = subprocess.run(
        [*command, "--crash", "audit:after_prepared:2"], env=env, capture_output=True, timeout=600
    )
    assert first.returncode == EXIT_CODE, first.stderr.decode()[-2000:]
    assert Snapshots(str(tmp_path / "job/stages/audit")).get(2).status.value == "PREPARED"
    second = subprocess.run(command, env=env, capture_output=True, timeout=600)
    assert second.returncode == 0, second.stderr.decode()[-2000:]
    assert_job_matches(spark, job_of(spark, tmp_path, key_groups=8), ALL)


def test_grouped_and_asynchronous_commits_keep_the_cut(spark: SparkSession, tmp_path: Path) -> None:
    medallion.write_events(tmp_path / "in", FILES)
    job = job_of(
        spark,
        tmp_path,
        stage_configs={
            "silver": AbsConfig(key_groups=4, commit_mode="async", snapshot_interval=2),
            "gold": AbsConfig(key_groups=4, commit_mode="sync", snapshot_interval=3),
        },
    )
    job.run()
    stages = {name: Snapshots(stage.root).list() for name, stage in job.stages.items()}
    assert any(i.status.value == "MERGED" for i in stages["silver"]), "silver grouped epochs"
    common = set.intersection(
        *({i.epoch for i in infos if i.status.value == "COMMITTED"} for infos in stages.values())
    )
    assert max(common) == len(FILES) - 1, "the stop commits every stage's open group"
    assert_job_matches(spark, job, {n: n for n in sorted(common)})


def test_a_started_job_runs_at_once_every_stage_that_continues_its_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    medallion.write_events(tmp_path / "in", FILES[:2])
    job = job_of(spark, tmp_path)
    job.run()
    running = job.start()
    try:
        assert running.waiting == [], "each stage waits in its query, not for its start-up"
        medallion.write_events(tmp_path / "in", FILES[2:3])
        running.process_all_available()
    finally:
        running.stop()
    job.rollback(1)  # restore epoch 3: every stage starts a fresh checkpoint, which must wait
    running = job.start()
    try:
        medallion.write_events(tmp_path / "in", FILES[3:4])
        running.process_all_available()
    finally:
        running.stop()
    assert_job_matches(spark, job, {0: 0, 1: 1, 2: 2, 3: 1, 4: 2, 5: 3})


def test_a_job_rollback_gives_what_the_uninterrupted_job_gives_also_twice(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    medallion.write_events(tmp_path / "in", FILES[:4])
    job = job_of(spark, tmp_path)
    job.run()
    running = job.start()
    with pytest.raises(FencingError, match="rollback of job 'medallion'"):
        job.rollback(1)  # refused before the decision: nothing is left to finish later
    with pytest.raises(FencingError):  # a second run of the same job, meanwhile
        job_of(spark, tmp_path).run()
    compact(job.stages["bronze"].root)  # maintenance while the job runs rewrites its manifest
    running.stop()
    assert open_job(DeltaStore(), job.root, "medallion").unfinished is None
    done = job.rollback(1)
    assert (done.epoch, done.restore_epoch, done.status) == (1, 4, DecisionStatus.COMMITTED)
    medallion.write_events(tmp_path / "in", FILES[4:])
    job.run()
    # the files after epoch 1 are read again, then the new one: 5, 6, 7 read files 2, 3, 4
    first = {**ALL, 4: 1, 5: 2, 6: 3, 7: 4}
    assert_job_matches(spark, job, first)
    root = str(tmp_path / "job")
    assert cli(["job-rollback", root, "5"]) == 0
    capsys.readouterr()
    job.run()
    assert_job_matches(spark, job, {**first, 8: 2, 9: 3, 10: 4})
    assert cli(["job-snapshots", root, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [s["epoch"] for s in listed] == list(range(11))
    origins = {s["epoch"]: s["origin"] for s in listed if s["origin"] is not None}
    assert origins == {4: "rollback to 1", 8: "rollback to 5"}


def test_a_job_restored_into_a_new_root_with_other_counts_continues_as_the_original_would(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    medallion.write_events(tmp_path / "in", FILES[:4])
    job_of(spark, tmp_path).run()
    crash = AbsConfig(faults=(Fault(FaultStep.AFTER_PREPARED),))
    copy = medallion.build(
        spark, str(tmp_path / "in"), str(tmp_path / "copy"), config=AbsConfig(key_groups=8)
    )
    with pytest.raises(InjectedFault):  # the first stage's copy is decided, the rest not
        copy.restore_from(str(tmp_path / "job"), 2, config=crash)
    assert cli(["job-restore", str(tmp_path / "job"), "2", "--into", str(tmp_path / "copy")]) == 0
    assert "stages/silver" in capsys.readouterr().out
    medallion.write_events(tmp_path / "in", FILES[4:])
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    try:
        run_streaming(copy)  # fresh checkpoints: each stage waits for its first epoch
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    assert_job_matches(spark, copy, {2: 2, 3: 3, 4: 4})
    assert cli(["job-snapshots", str(tmp_path / "copy")]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert any(line.startswith("2 ") and "restore of " in line for line in listed), listed


def test_a_crash_inside_a_job_rollback_is_finished_by_the_next_start(
    spark: SparkSession, tmp_path: Path
) -> None:
    medallion.write_events(tmp_path / "in", FILES[:4])
    job = job_of(spark, tmp_path)
    job.run()
    with pytest.raises(InjectedFault):
        job.rollback(1, config=AbsConfig(faults=(Fault(FaultStep.AFTER_PREPARED),)))
    assert open_job(DeltaStore(), job.root, "medallion").unfinished is not None
    job.run()
    assert open_job(DeltaStore(), job.root, "medallion").unfinished is None
    assert_job_matches(spark, job, {0: 0, 1: 1, 2: 2, 3: 3, 4: 1, 5: 2, 6: 3})


def test_one_stage_rolled_back_alone_is_refused_or_stops_its_readers_until_a_job_rollback(
    spark: SparkSession, tmp_path: Path
) -> None:
    medallion.write_events(tmp_path / "in", FILES[:3])
    job = job_of(spark, tmp_path)
    job.run()
    with pytest.raises(ConfigError, match="stage of a job"):
        rollback(job.stages["silver"].root, 1)
    rollback(job.stages["bronze"].root, 0)  # a head stage reads no channel: allowed alone
    with pytest.raises(SourceError, match="rolled back on its own"):
        job.run()
    assert [i.epoch for i in Snapshots(job.stages["gold"].root).list()] == [0, 1, 2]
    job.rollback(2)  # restore epoch 6: after bronze's restore epoch 3 and its epochs 4 and 5
    medallion.write_events(tmp_path / "in", FILES[3:4])
    job.run()
    assert_job_matches(spark, job, {0: 0, 1: 1, 2: 2, 6: 2, 7: 3})


def test_a_named_job_savepoint_outlives_retention_and_rolls_the_job_back(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    medallion.write_events(tmp_path / "in", FILES[:4])
    job = job_of(spark, tmp_path)
    job.run()
    running = job.start()
    with pytest.raises(ConfigError, match="cannot name a savepoint"):
        running.stop(savepoint="9 lives")  # refused before anything stops
    named = running.stop(savepoint="v1")
    assert named is not None
    assert named.epoch == 3
    medallion.write_events(tmp_path / "in", FILES[4:])
    job.run()
    for stage in job.stages.values():
        vacuum(stage.root, keep_last=1)
    assert [s.epoch for s in job.snapshots()] == [3, 4]
    with pytest.raises(ConfigError, match="already names epoch 3"):
        job.tag(4, "v1")
    root = str(tmp_path / "job")
    assert cli(["job-tag", root, "4", "v2"]) == 0
    assert (
        "job snapshot 4 (bronze=4 silver=4 audit=4 gold=4) is named 'v2'" in capsys.readouterr().out
    )
    untag(job.stages["gold"].root, "v2")
    with pytest.raises(SnapshotNotFoundError, match=r"stage\(s\) \['gold'\] lack the name"):
        job.rollback("v2")

    assert cli(["job-rollback", root, "v1"]) == 0
    assert "job rolled back to epoch 3" in capsys.readouterr().out
    job.run()
    assert_job_matches(spark, job, {3: 3, 4: 4, 5: 3, 6: 4})


def test_bad_jobs_and_early_starts_are_refused_with_what_to_do(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    medallion.write_events(tmp_path / "in", FILES[:1])
    job = job_of(spark, tmp_path)
    bronze, silver = job.stages["bronze"], job.stages["silver"]
    with pytest.raises(OperatorDefinitionError, match="not a stage of this job"):
        Job("partial", str(tmp_path / "p"), [silver])
    with pytest.raises(OperatorDefinitionError, match="share the name"):
        Job("twice", str(tmp_path / "t"), [bronze, bronze])
    off = Pipeline(
        "bronze",
        bronze.source,
        medallion.land,
        root=bronze.root,
        sinks=str(tmp_path / "other"),
        config=AbsConfig(snapshots=False),
    )
    with pytest.raises(ConfigError, match="snapshots off"):
        Job("off", str(tmp_path / "o"), [off, silver])
    # a cycle: a stage named and rooted like bronze that reads silver's channel
    loop = Pipeline(
        "bronze", silver.channel(), medallion.land, root=bronze.root, sinks=str(tmp_path / "x")
    )
    with pytest.raises(OperatorDefinitionError, match="cycle"):
        Job("loop", str(tmp_path / "l"), [loop, silver])
    with pytest.raises(OperatorDefinitionError, match="no sink for output"):
        bronze.channel("missing")
    with pytest.raises(OperatorDefinitionError, match="one or more channels"):
        ChannelSource(())
    with pytest.raises(UpstreamNotReadyError, match="upstream epoch 0"):
        silver.start()
    capsys.readouterr()
    assert cli(["job-snapshots", str(tmp_path / "nowhere")]) == 2
    assert "is not a job root" in capsys.readouterr().err
