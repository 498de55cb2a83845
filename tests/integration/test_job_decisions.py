"""Job-wide decisions where features meet jobs: a stage's state migration, state written to a
stage, a decision interrupted and then a stage started on its own, and a stage added after a
job rollback. Every job snapshot is compared with a model of the input (tests/support/jobs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import pyspark_abs.job_actions.decisions as job_decisions
from pyspark_abs import (
    AbsConfig,
    EpochStatus,
    Job,
    Pipeline,
    Snapshots,
    check,
    rollback,
    write_state,
)
from pyspark_abs.cli import EXIT_PROBLEMS, EXIT_USAGE
from pyspark_abs.cli import main as cli
from pyspark_abs.errors import (
    CommitError,
    ConfigError,
    ExternalChangeError,
    InjectedFault,
    UncommittableEpochError,
    UpstreamNotReadyError,
)
from pyspark_abs.examples import medallion
from pyspark_abs.faults import EXIT_CODE, Fault, FaultStep
from pyspark_abs.install.installing import StateInstall
from pyspark_abs.job_ledger.manifest import DecisionStatus, JobRecord, open_job
from pyspark_abs.manifest.table import open_manifest
from pyspark_abs.operators.contract import KeyGroupContext, KeyGroupResult, vectorized_operator
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from tests.support.docs import run_block
from tests.support.jobs import (
    FILES,
    Event,
    Forget,
    assert_job_matches,
    dedup_v2,
    job_of,
    model,
    run_streaming,
)
from tests.support.pipelines import assert_same

SYNC = AbsConfig(key_groups=4, commit_mode="sync")


def test_a_stage_redeployed_with_a_new_state_schema_migrates_with_the_whole_job(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Silver's new state schema is a job-wide decision; the application dies inside it."""
    medallion.write_events(tmp_path / "in", FILES[:3])
    job_of(spark, tmp_path).run()
    medallion.write_events(tmp_path / "in", FILES[3:])
    job = medallion.build(
        spark,
        str(tmp_path / "in"),
        str(tmp_path / "job"),
        config=SYNC,
        operators={"silver": dedup_v2},
    )
    report = check(job.stages["silver"])
    assert report.exit_code == 3
    assert any("every stage goes back to job snapshot 2" in d for d in report.items[0].details)
    with pytest.raises(ConfigError, match="which every stage of the job takes together"):
        job.stages["silver"].start(available_now=True)
    # the application is killed as silver's part of the decision is PREPARED
    crashed = subprocess.run(
        [sys.executable, "-m", "tests.support.job_runs", str(tmp_path), "silver:after_prepared:3"],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        capture_output=True,
        timeout=600,
    )
    assert crashed.returncode == EXIT_CODE, crashed.stderr.decode()[-2000:]
    unfinished = open_job(DeltaStore(), SnapshotRoot(tmp_path / "job"), None).unfinished
    assert unfinished is not None
    assert (unfinished.kind, unfinished.restore_epoch, list(unfinished.states)) == (
        JobRecord.MIGRATE,
        3,
        ["silver"],
    )
    with pytest.raises(UpstreamNotReadyError):  # gold alone installs its part, then waits
        job.stages["gold"].start(available_now=True)
    gold = Snapshots(job.stages["gold"].root).get(3)
    assert (gold.restored_from, gold.status.value) == (2, "RESTORED")
    run_streaming(job)  # each stage finishes its part of the migration as it starts
    assert check(job.stages["silver"]).exit_code == 0
    expected = {0: 0, 1: 1, 2: 2, 3: 2, 4: 3, 5: 4}
    assert_job_matches(spark, job, expected)
    seen = job.state("silver", 5).select("seen").distinct().collect()
    assert [r.seen for r in seen] == [1]


def test_state_written_to_a_job_stage_goes_in_for_the_whole_job(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Silver forgets event e1 (written state), so e1 counts again when it arrives again."""
    medallion.write_events(tmp_path / "in", FILES[:4])
    job = job_of(spark, tmp_path)
    job.run()
    medallion.write_events(tmp_path / "in", FILES[4:])
    for alone in ("bronze", "silver"):  # silver runs ahead of the newest job snapshot
        job.stages[alone].start(available_now=True).await_termination()
    silver = job.stages["silver"]
    with pytest.raises(ConfigError, match=r"has snapshots up to epoch 4, after job snapshot 3"):
        write_state(silver.snapshots.state("dedup"), silver.root, medallion.dedup)
    job.run()

    forgotten = job.state("silver").filter(F.col("event_id") != "e1")
    info = write_state(forgotten, silver.root, medallion.dedup)
    assert info.epoch == 5
    decided = open_job(DeltaStore(), job.root, None).decisions[-1]
    assert (decided.kind, decided.epoch, decided.status) == (
        JobRecord.WRITE_STATE,
        4,
        DecisionStatus.COMMITTED,
    )
    again: list[Event] = [("e1", "ann", 5), ("e7", "cy", 1)]
    medallion.write_events(tmp_path / "in", [again])
    run_streaming(job)
    steps: list[list[Event] | Forget] = [*FILES, Forget({"e1"}), again]
    assert_job_matches(spark, job, {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6}, steps)
    ann = [r for r in model(steps, 6)["gold"] if r[0] == "ann"]
    assert ann == [("ann", 15, 4)]  # e1 twice


class Crash(Exception):
    """The process dies here."""


def test_an_interrupted_job_decision_holds_back_every_stage_until_it_has_its_part(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job rollback that dies after its decision: bronze started alone installs its part
    before it runs. A decision an older version let a stage run past (its restore epoch taken
    by a micro-batch) is decided again with a later restore epoch."""
    medallion.write_events(tmp_path / "in", FILES[:3])
    job = job_of(spark, tmp_path)
    job.run()

    def crash(*args: object, **kwargs: object) -> None:
        raise Crash

    with monkeypatch.context() as patch:
        patch.setattr(job_decisions, "install_part", crash)
        with pytest.raises(Crash):
            job.rollback(1)
    medallion.write_events(tmp_path / "in", FILES[3:4])
    job.stages["bronze"].start(available_now=True).await_termination()
    bronze = [(i.epoch, i.status.value) for i in Snapshots(job.stages["bronze"].root).list()]
    assert bronze[-3:] == [(3, "RESTORED"), (4, "COMMITTED"), (5, "COMMITTED")]
    job.run()
    first = {0: 0, 1: 1, 2: 2, 3: 1, 4: 2, 5: 3}
    assert_job_matches(spark, job, first)

    with monkeypatch.context() as patch:
        patch.setattr(job_decisions, "install_part", crash)
        with pytest.raises(Crash):
            job.rollback(4)  # restore epoch 6
    medallion.write_events(tmp_path / "in", FILES[4:])
    with monkeypatch.context() as patch:  # as an older pyspark-abs did: no part installed
        patch.setattr("pyspark_abs.pipeline.start.settle_stage", lambda *a: None)
        job.stages["bronze"].start(available_now=True).await_termination()
    assert Snapshots(job.stages["bronze"].root).get(6).status.value == "COMMITTED"
    job.run()
    decisions = open_job(DeltaStore(), job.root, None).decisions
    assert [(d.restore_epoch, d.status) for d in decisions[-2:]] == [
        (6, DecisionStatus.ABANDONED),
        (7, DecisionStatus.COMMITTED),
    ]
    assert_job_matches(spark, job, {**first, 7: 2, 8: 3, 9: 4})


@vectorized_operator(
    key="user", state_schema="events long", output_schema="user string, events long"
)
def tally(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """A stage added later: each user's events kept by silver."""
    counts = rows.groupby("user", sort=False).size().rename("new").reset_index()
    merged = counts.merge(state[["user", "events"]], on="user", how="left")
    merged["events"] = merged["events"].fillna(0).astype("int64") + merged["new"]
    updated = merged[["user", "events"]]
    return KeyGroupResult(state=updated, output=updated)


def test_a_stage_added_after_a_job_rollback_follows_the_timeline_the_job_continues(
    spark: SparkSession, tmp_path: Path
) -> None:
    medallion.write_events(tmp_path / "in", FILES[:3])
    job = job_of(spark, tmp_path)
    job.run()
    job.rollback(1)
    medallion.write_events(tmp_path / "in", FILES[3:])
    job.run()
    silver = job.stages["silver"]
    added = Pipeline(
        "tally",
        silver.channel(),
        tally,
        root=f"{job.root}/stages/tally",
        sinks=f"{job.root}/tables/tally",
        config=SYNC,
    )
    grown = Job("medallion", job.root, [*job.stages.values(), added])
    grown.run()
    # tally read the epoch the rollback took back (2) as empty: no job snapshot there
    expected = {0: 0, 1: 1, 3: 1, 4: 2, 5: 3, 6: 4}
    assert_job_matches(spark, grown, expected)
    for epoch, through in expected.items():
        users = [(u, n) for u, _, n in model(FILES, through)["gold"]]
        assert_same(
            grown.state("tally", epoch), spark.createDataFrame(users, "user string, events long")
        )
    grown.rollback(4)
    grown.run()
    assert_job_matches(spark, grown, {**expected, 7: 2, 8: 3, 9: 4})


def test_stages_restarted_with_other_intervals_and_commit_modes_stay_exact(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Silver and gold restart with a snapshot interval and async commits, later bronze too:
    the job snapshots are the epochs every stage committed, each one exact, also after a
    job rollback."""
    medallion.write_events(tmp_path / "in", FILES[:2])
    job_of(spark, tmp_path).run()
    medallion.write_events(tmp_path / "in", FILES[2:4])
    grouped = AbsConfig(key_groups=4, commit_mode="async", snapshot_interval=2)
    job_of(spark, tmp_path, {"silver": grouped, "gold": AbsConfig(key_groups=4)}).run()
    medallion.write_events(tmp_path / "in", FILES[4:])
    bronze = AbsConfig(key_groups=4, commit_mode="async", snapshot_interval=3)
    job = job_of(spark, tmp_path, {"bronze": bronze})
    job.run()
    merged = [
        i.epoch for i in Snapshots(job.stages["silver"].root).list() if i.status.value == "MERGED"
    ]
    assert merged == [2]
    assert_job_matches(spark, job, {0: 0, 1: 1, 3: 3, 4: 4})
    job.rollback(3)
    job.run()
    assert_job_matches(spark, job, {0: 0, 1: 1, 3: 3, 4: 4, 5: 3, 6: 4})


def test_a_stuck_epoch_of_a_job_stage_is_replaced_by_a_job_rollback_and_the_job_matches_the_model(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bronze decided epoch 3, then a file it wrote was deleted before its commit. The start
    and a rollback of bronze alone (silver may have read the decided epoch) refuse and name
    the job rollback; the job rollback replaces the epoch (it crashes after, and the next
    start finishes it), and the job then gives what the uninterrupted job gives."""
    medallion.write_events(tmp_path / "in", FILES[:3])
    job_of(spark, tmp_path).run()
    medallion.write_events(tmp_path / "in", FILES[3:4])
    crash = AbsConfig(
        key_groups=4, commit_mode="sync", faults=(Fault(FaultStep.AFTER_PREPARED, epoch=3),)
    )
    with pytest.raises(InjectedFault):
        job_of(spark, tmp_path, stage_configs={"bronze": crash}).run()
    job = job_of(spark, tmp_path)
    bronze = job.stages["bronze"].root
    (stuck,) = open_manifest(DeltaStore(), bronze, "bronze").pending()
    written = stuck.files[0]
    (Path(stuck.tables[written.table]) / written.path).unlink()
    before = [(i.epoch, i.status) for i in Snapshots(bronze).list(include_aborted=True)]
    assert before[-1] == (3, EpochStatus.PREPARED)
    way_out = r"epoch 3 can never be committed: its file .* is gone.*Job\.rollback\(2\)"
    with pytest.raises(UncommittableEpochError, match=way_out):
        job.run()
    with pytest.raises(UncommittableEpochError, match=way_out):
        rollback(bronze, 2)
    assert [(i.epoch, i.status) for i in Snapshots(bronze).list(include_aborted=True)] == before
    assert cli(["validate", bronze]) == EXIT_PROBLEMS
    listed = "epoch 3: decided (PREPARED) but no start can commit it: its file"
    assert listed in capsys.readouterr().out

    crashed = AbsConfig(faults=(Fault(FaultStep.AFTER_PREPARED, epoch=4),))
    with pytest.raises(InjectedFault):  # in bronze, once it has replaced epoch 3
        job.rollback(2, config=crashed)
    replaced = open_manifest(DeltaStore(), bronze, "bronze").latest(3)
    assert replaced is not None
    assert replaced.status is EpochStatus.ABORTED
    assert "replaced by restore epoch 4" in str(replaced.error)
    _runs_on_after_a_rollback_to_2(spark, job, tmp_path, FILES[4:])  # finishes the rollback


def test_a_decision_whose_state_file_was_deleted_is_abandoned_by_a_job_rollback(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """write_state crashed after its decision, then a state file it decided for gold was
    deleted: the decision can never be finished. Each start says so and names the job
    rollback, which abandons the decision, replaces gold's part, and gives the model's
    results."""
    medallion.write_events(tmp_path / "in", FILES[:3])
    job = job_of(spark, tmp_path)
    job.run()
    crash = AbsConfig(faults=(Fault(FaultStep.AFTER_PREPARED, epoch=3),))
    gold = job.stages["gold"]
    with pytest.raises(InjectedFault):
        write_state(job.state("gold"), gold.root, medallion.totals, config=crash)
    decided = open_job(DeltaStore(), job.root, None).unfinished
    assert decided is not None
    assert decided.kind is JobRecord.WRITE_STATE
    install = StateInstall.from_json(decided.states["gold"])
    (Path(install.uri) / install.files[0].path).unlink()
    with pytest.raises(CommitError):  # gold's part is decided now, then cannot commit
        job.run()
    way_out = (
        r"epoch 3 can never be committed: its file .* is gone.*part of the unfinished write "
        r"state of job 'medallion', which the job rollback abandons\): Job\.rollback\(2\)"
    )
    with pytest.raises(UncommittableEpochError, match=way_out):
        job.run()
    decisions = open_job(DeltaStore(), job.root, None).decisions
    assert cli(["job-rollback", job.root, "7"]) == EXIT_USAGE  # no job snapshot 7
    assert "epoch 7 is not a job snapshot" in capsys.readouterr().err
    assert open_job(DeltaStore(), job.root, None).decisions == decisions  # nothing recorded

    run_block("job.rollback(job.snapshots()[-1].epoch)", {"job": job}, {})
    kinds = [(d.kind, d.status) for d in open_job(DeltaStore(), job.root, None).decisions]
    assert kinds[-2:] == [
        (JobRecord.WRITE_STATE, DecisionStatus.ABANDONED),
        (JobRecord.ROLLBACK, DecisionStatus.COMMITTED),
    ]
    _runs_on_after_a_rollback_to_2(spark, job, tmp_path, FILES[3:])


def _runs_on_after_a_rollback_to_2(
    spark: SparkSession, job: Job, tmp_path: Path, rest: list[list[Event]]
) -> None:
    """After a job rollback to job snapshot 2 (restore epoch 4), the job is given ``rest``,
    which completes its input to FILES, runs, and matches the model (epochs 5 and 6 read
    FILES[3] and FILES[4])."""
    medallion.write_events(tmp_path / "in", rest)
    job.run()
    assert_job_matches(spark, job, {0: 0, 1: 1, 2: 2, 4: 2, 5: 3, 6: 4})


def test_a_job_rollback_past_a_vacuum_of_a_stage_sink_is_refused_before_anything_changes(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An OPTIMIZE then a VACUUM of gold's sink deleted the files of its old versions: a job
    rollback to a snapshot before them is refused before it decides anything, and the job
    goes on as the model says."""
    medallion.write_events(tmp_path / "in", FILES[:3])
    job = job_of(spark, tmp_path)
    job.run()
    gold = DeltaTable(str(tmp_path / "job" / "tables" / "gold"))
    assert gold.optimize.compact()["numFilesRemoved"] > 0
    gold.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    decisions = open_job(DeltaStore(), job.root, None).decisions
    with pytest.raises(
        ExternalChangeError, match=r"cannot go back to its version \d+ .* are gone.*Nothing was"
    ):
        job.rollback(0)
    assert open_job(DeltaStore(), job.root, None).decisions == decisions

    medallion.write_events(tmp_path / "in", FILES[3:])
    job.run()
    assert_job_matches(spark, job, {step: step for step in range(len(FILES))})
