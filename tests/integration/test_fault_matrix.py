"""A fault at every protocol step, then a restart: the result equals a failure-free run.

Also a fault inside each maintenance operation (compaction, vacuum, rollback, restore), then
the operation again: nothing committed is lost and ``validate`` passes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_abs import AbsConfig, Snapshots, restore, rollback
from pyspark_abs.errors import InjectedFault
from pyspark_abs.faults import EXIT_CODE, Fault, FaultAction, FaultStep
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.compaction import compact
from pyspark_abs.upkeep.retention import vacuum
from pyspark_abs.upkeep.validation import validate
from tests.support.inputs import EPOCHS, write_epochs
from tests.support.pipelines import assert_same, assert_word_counts, state_history, word_pipeline

FAULTS = [
    Fault(FaultStep.PRECOMMIT_TASK, epoch=1),
    Fault(FaultStep.PRECOMMIT_TASK, epoch=2, partition=1, action=FaultAction.EXIT),
    Fault(FaultStep.AFTER_ALIGN, epoch=1),
    Fault(FaultStep.AFTER_PREPARED, epoch=1),
    Fault(FaultStep.BETWEEN_TABLE_COMMITS, epoch=1),
    Fault(FaultStep.AFTER_COMMITTED, epoch=1),
]
"""One line per protocol step; a new step is one more line."""


@pytest.fixture(scope="module")
def reference(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Snapshots:
    """Snapshots of a failure-free run over EPOCHS, checked against the input."""
    base = tmp_path_factory.mktemp("reference")
    word_pipeline(write_epochs(base / "in", EPOCHS), base / "root").run()
    assert_word_counts(spark, base / "root", EPOCHS)
    return Snapshots(str(base / "root"), spark)


def assert_equals_reference(spark: SparkSession, root: Path, reference: Snapshots) -> None:
    """State as of every epoch and sink rows equal the failure-free run's."""
    snapshots = Snapshots(str(root), spark)
    assert [i.epoch for i in snapshots.list()] == [i.epoch for i in reference.list()]
    assert_same(state_history(snapshots), state_history(reference))
    assert_same(snapshots.sink("output"), reference.sink("output"))


def orphans(table: Path) -> set[str]:
    """Parquet files in a table directory that its Delta log does not reference."""
    referenced = {Path(u).name for u in DeltaStore().open(str(table)).file_uris()}
    return {p.name for p in table.glob("*.parquet")} - referenced


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(f, marks=pytest.mark.compat)
        if f.step in (FaultStep.AFTER_PREPARED, FaultStep.BETWEEN_TABLE_COMMITS)
        else f
        for f in FAULTS
    ],
    ids=lambda f: f"{f.step.value}-{f.action.value}",
)
def test_restart_after_fault_equals_failure_free_run(
    spark: SparkSession, tmp_path: Path, reference: Snapshots, fault: Fault, mode: str
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    crashing = word_pipeline(inputs, root, commit_mode=mode, faults=(fault,))
    if fault.step is FaultStep.PRECOMMIT_TASK:
        crashing.run()  # Spark retries the failed task; the retry's files are committed
        assert orphans(root / "state" / "word_count"), "the failed attempt left no files"
    else:
        with pytest.raises(InjectedFault, match=f"'{fault.step.value}' of epoch 1"):
            crashing.run()
        restarted = word_pipeline(inputs, root, commit_mode=mode).run()
        if fault.step in (FaultStep.AFTER_PREPARED, FaultStep.BETWEEN_TABLE_COMMITS):
            assert 1 in restarted.recovered_epochs
    assert_equals_reference(spark, root, reference)


def test_process_killed_in_the_background_committer_recovers(
    spark: SparkSession, tmp_path: Path, reference: Snapshots
) -> None:
    crash, mode = "between_table_commits:2", "async"
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    command = [
        sys.executable,
        "-m",
        "pyspark_abs.examples.wordcount",
        "--input",
        str(inputs),
        "--root",
        str(root),
        "--key-groups",
        "8",
        "--commit-mode",
        mode,
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    first = subprocess.run([*command, "--crash", crash], env=env, capture_output=True, timeout=300)
    assert first.returncode == EXIT_CODE, first.stderr.decode()[-2000:]
    epoch = int(crash.split(":")[1])
    assert Snapshots(str(root)).get(epoch).status.value == "PREPARED"
    second = subprocess.run(command, env=env, capture_output=True, timeout=300)
    assert second.returncode == 0, second.stderr.decode()[-2000:]
    assert_equals_reference(spark, root, reference)


def _state_and_sink_as_of(
    spark: SparkSession, root: Path, reference: Snapshots, epoch: int
) -> None:
    """The newest snapshot of ``root`` equals the reference's snapshot of ``epoch``."""
    snapshots = Snapshots(str(root), spark)
    assert_same(snapshots.state("word_count"), reference.state("word_count", epoch))
    assert_same(snapshots.sink("output"), reference.sink("output", epoch))


def _compact(root: Path, faults: tuple[Fault, ...]) -> None:
    compact(str(root), config=AbsConfig(faults=faults))


def _vacuum(root: Path, faults: tuple[Fault, ...]) -> None:
    vacuum(str(root), keep_last=1, min_age_seconds=0, config=AbsConfig(faults=faults))


def _rollback(root: Path, faults: tuple[Fault, ...]) -> None:
    rollback(str(root), 2, config=AbsConfig(faults=faults))


def _restore(root: Path, faults: tuple[Fault, ...]) -> None:
    restore(str(root), 2, into=str(root.parent / "copy"), config=AbsConfig(faults=faults))


MAINTENANCE_FAULTS = [
    (_compact, Fault(FaultStep.DURING_COMPACTION), None),
    (_vacuum, Fault(FaultStep.DURING_VACUUM), 2),
    (_rollback, Fault(FaultStep.AFTER_PREPARED), 2),
    (_rollback, Fault(FaultStep.BETWEEN_TABLE_COMMITS), 2),
    (_rollback, Fault(FaultStep.AFTER_COMMITTED), 2),
    (_restore, Fault(FaultStep.AFTER_PREPARED), 2),
    (_restore, Fault(FaultStep.BETWEEN_TABLE_COMMITS), 2),
]
"""Operation, fault, and the reference epoch its result equals (None: all epochs kept).

The vacuum runs after a rollback to epoch 2, so that it has files to delete in two tables.
"""


@pytest.mark.parametrize(
    ("operation", "fault", "as_of"),
    MAINTENANCE_FAULTS,
    ids=[f"{op.__name__.strip('_')}-{fault.step.value}" for op, fault, _ in MAINTENANCE_FAULTS],
)
def test_maintenance_interrupted_then_run_again_loses_nothing(
    spark: SparkSession,
    tmp_path: Path,
    reference: Snapshots,
    operation: Callable[[Path, tuple[Fault, ...]], None],
    fault: Fault,
    as_of: int | None,
) -> None:
    root = tmp_path / "root"
    word_pipeline(write_epochs(tmp_path / "in", EPOCHS), root, bronze=True).run()
    if operation is _vacuum:
        rollback(str(root), 2)
    with pytest.raises(InjectedFault, match=fault.step.value):
        operation(root, (fault,))
    operation(root, ())  # run again: it finishes or redoes the interrupted work
    result = root.parent / "copy" if operation is _restore else root
    assert validate(str(result)) == []
    if as_of is None:
        assert_equals_reference(spark, root, reference)
    elif operation is _restore:
        assert_same(
            Snapshots(str(result), spark).state("word_count"), reference.state("word_count", 2)
        )
    else:
        _state_and_sink_as_of(spark, result, reference, as_of)
