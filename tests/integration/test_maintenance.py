"""Compaction, retention, vacuum and validation of a real snapshot root."""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pyspark_abs import CommitError, ManifestError, SnapshotNotFoundError, Snapshots, rollback
from pyspark_abs.maintenance import compact, vacuum, validate
from pyspark_abs.store import DeltaStore
from tests.conftest import EPOCHS, write_epochs
from tests.integration.conftest import (
    assert_same,
    assert_word_counts,
    expected_history,
    expected_state,
    state_history,
    word_pipeline,
)

STATE = "state/word_count"
MORE = ("a l m", "b a n")


def live_files(table: Path) -> list[str]:
    return [Path(u).name for u in DeltaTable(str(table)).file_uris()]


def test_compaction_keeps_every_epoch_readable(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "root"
    word_pipeline(spark, write_epochs(tmp_path / "in", EPOCHS), root).run()
    files_before = live_files(root / STATE)
    assert len(files_before) > 1

    (result,) = compact(str(root))
    assert (result.table, result.as_of_epoch, result.files_before) == (STATE, 3, len(files_before))
    assert result.rows_after == Snapshots(str(root), spark).get(3).state_keys
    assert result.rows_before > result.rows_after
    assert all(name.startswith("abs-c") for name in live_files(root / STATE))
    assert_word_counts(spark, root, EPOCHS)
    assert validate(str(root)) == []


def test_background_compaction_while_the_pipeline_runs(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "root"
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    word_pipeline(spark, inputs, root, compaction_every_epochs=2, commit_mode="async").run()
    assert any(name.startswith("abs-c") for name in live_files(root / STATE))
    assert_word_counts(spark, root, EPOCHS)
    assert validate(str(root)) == []


def test_retention_and_vacuum(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "root"
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    word_pipeline(spark, inputs, root).run()
    compact(str(root))
    write_epochs(inputs, (*EPOCHS, *MORE))
    word_pipeline(spark, inputs, root).run()
    state_dir = root / STATE
    orphan = state_dir / "abs-e000000000001-p00000-a7-0123456789ab-000.parquet"
    orphan.write_bytes(b"left by a failed task attempt")
    in_flight = state_dir / "abs-e000000000099-p00000-a0-0123456789ab-000.parquet"
    in_flight.write_bytes(b"written by an epoch not decided yet")
    before = set(p.name for p in state_dir.glob("*.parquet"))

    dry = vacuum(str(root), keep_last=2, dry_run=True)
    assert dry.dry_run
    assert orphan.name in dry.deleted[STATE]
    assert set(p.name for p in state_dir.glob("*.parquet")) == before
    assert "EXPIRED" not in {s.status.value for s in Snapshots(str(root), spark).list()}

    report = vacuum(str(root), keep_last=2)
    assert report.expired == dry.expired == [0, 1, 2, 3]
    assert report.deleted == dry.deleted
    assert orphan.name in report.deleted[STATE]
    assert not orphan.exists()
    assert in_flight.exists()
    assert report.kept_in_flight >= 1
    assert not any(p.name.startswith("abs-e000000000000") for p in state_dir.glob("*.parquet"))

    snapshots = Snapshots(str(root), spark)
    statuses = {s.epoch: s.status.value for s in snapshots.list()}
    assert statuses == {
        0: "EXPIRED",
        1: "EXPIRED",
        2: "EXPIRED",
        3: "EXPIRED",
        4: "COMMITTED",
        5: "COMMITTED",
    }
    history = state_history(snapshots)
    assert_same(history, expected_history(spark, (*EPOCHS, *MORE)).where("as_of >= 4"))
    with pytest.raises(
        SnapshotNotFoundError, match=r"epoch 1 .* is EXPIRED; readable epochs are 4\.\.5"
    ):
        snapshots.state("word_count", 1)
    with pytest.raises(SnapshotNotFoundError, match="is EXPIRED"):
        rollback(str(root), 2)
    in_flight.unlink()
    assert validate(str(root)) == []


def test_validate_reports_damage(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "root"
    word_pipeline(spark, write_epochs(tmp_path / "in", EPOCHS), root).run()
    state_file = sorted((root / STATE).glob("abs-e000000000002-*.parquet"))[0]
    state_file.unlink()
    sink_dir = root / "sinks" / "word_counts"
    sink_file = sorted(sink_dir.glob("abs-e000000000003-*.parquet"))[0]
    sink_file.write_bytes(sink_file.read_bytes()[:20])

    problems = [str(p) for p in validate(str(root))]
    assert f"epoch 2, table {STATE}: file {state_file.name} of version" in "\n".join(problems)
    assert any(
        p.startswith("epoch 3, table sink/output: file") and "has 20 bytes" in p for p in problems
    )
    assert not any(p.startswith(("epoch 0", "epoch 1")) for p in problems)


def race(*calls: Callable[[], object]) -> list[BaseException | None]:
    """Run the calls in threads released together; return what each raised."""
    start = threading.Barrier(len(calls))
    outcomes: list[BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        start.wait()
        try:
            calls[i]()
        except BaseException as err:
            outcomes[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def manifest_counts(root: Path) -> Counter[tuple[int, str]]:
    """How often each (epoch, status) is in the manifest table, duplicates included."""
    rows = DeltaStore().read(str(root / "_manifest"), columns=["epoch", "status"]).to_pylist()
    return Counter((r["epoch"], r["status"]) for r in rows)


def test_concurrent_rollbacks_and_vacuums_leave_a_loadable_root(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two rollbacks, then two vacuums, racing on one root: no transition is recorded twice."""
    root = tmp_path / "root"
    word_pipeline(spark, write_epochs(tmp_path / "in", EPOCHS), root).run()
    for _round in range(3):
        outcomes = race(lambda: rollback(str(root), 1), lambda: rollback(str(root), 1))
        assert None in outcomes, outcomes
        for outcome in outcomes:
            # The loser lost the manifest race for the restore epoch; or, having loaded the
            # manifest after the winner's PREPARED, its recovery raced the winner's commit
            # of that epoch and lost the table race (the epoch is committed once either way).
            if isinstance(outcome, CommitError):
                assert "stays PREPARED" in str(outcome), outcome
            elif outcome is not None:
                assert isinstance(outcome, ManifestError), outcome
                assert re.search(
                    r"epoch \d+: PREPARED is not recorded at snapshot root .*: another writer "
                    r"recorded PREPARED for epoch \d+",
                    str(outcome),
                ), outcome
        counts = manifest_counts(root)
        assert set(counts.values()) == {1}, counts
    restores = [s for s in Snapshots(str(root), spark).list() if s.status.value == "RESTORED"]
    assert 3 <= len(restores) <= 6
    assert_same(Snapshots(str(root), spark).state("word_count"), expected_state(spark, EPOCHS[:2]))

    outcomes = race(
        lambda: vacuum(str(root), keep_last=1, min_age_seconds=0),
        lambda: vacuum(str(root), keep_last=1, min_age_seconds=0),
    )
    assert outcomes == [None, None]
    counts = manifest_counts(root)
    assert set(counts.values()) == {1}, counts
    snapshots = Snapshots(str(root), spark).list()
    assert [s.status.value for s in snapshots].count("EXPIRED") == len(snapshots) - 1
    assert_same(Snapshots(str(root), spark).state("word_count"), expected_state(spark, EPOCHS[:2]))
    assert validate(str(root)) == []
