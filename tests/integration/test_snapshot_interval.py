"""Snapshot interval: epochs committed in groups, MERGED epochs, the stop's open group, crashes.

A word count over seven one-file epochs with ``snapshot_interval=3`` snapshots epochs 2 and 5
and, when the run ends, the open group's last epoch 6; epochs 0, 1, 3 and 4 are MERGED into
the snapshot after them. Every snapshot's state and sink equal a count computed directly
from the input, and a crash mid-group loses and repeats nothing.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pyspark_abs import (
    AbsConfig,
    BackEdge,
    EpochStatus,
    Pipeline,
    SnapshotInfo,
    SnapshotListener,
    Snapshots,
    cli,
    rollback,
)
from pyspark_abs.errors import (
    ConfigError,
    InjectedFault,
    SnapshotDamagedError,
    SnapshotNotFoundError,
)
from pyspark_abs.examples import retry, wordcount
from pyspark_abs.faults import Fault, FaultStep
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import manifest_root_id, open_manifest
from pyspark_abs.sources import DeltaSource
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.spark import load_dataframe
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.storage.transactions import EPOCH_KEY, app_id
from pyspark_abs.upkeep.retention import vacuum
from pyspark_abs.upkeep.validation import require_intact, validate
from tests.support.inputs import write_epochs
from tests.support.pipelines import (
    assert_same,
    bronze_table,
    expected_sink,
    expected_state,
    state_history,
)

EPOCHS = ("a b c a", "b d e", "a f a g h", "i b c j k", "c c d", "e a", "k l a")
"""Seven epochs; with interval 3 the snapshots are 2, 5 and (closed by the stop) 6."""

M, C = EpochStatus.MERGED, EpochStatus.COMMITTED
EVERY_THIRD = [(0, M, 2), (1, M, 2), (2, C, 2), (3, M, 5), (4, M, 5), (5, C, 5), (6, C, 6)]


class Committed(SnapshotListener):
    """Remembers the epochs it is told are committed."""

    def __init__(self) -> None:
        self.epochs: list[int] = []

    def on_epoch_committed(self, info: SnapshotInfo) -> None:
        self.epochs.append(info.epoch)


def interval_pipeline(
    inputs: Path, root: Path, listener: Committed | None = None, **config: Any
) -> Pipeline:
    """The example word count (through a bronze table) with ``snapshot_interval=3``, sync
    unless told otherwise."""
    settings: dict[str, Any] = {
        "key_groups": 8,
        "commit_mode": "sync",
        "snapshot_interval": 3,
        "compaction_ratio": 0,
    }
    settings.update(config)
    return Pipeline(
        "wordcount",
        DeltaSource(bronze_table(inputs), max_files_per_trigger=1),
        wordcount.word_count,
        root=str(root),
        sinks={"output": str(root / "sinks" / "word_counts")},
        config=AbsConfig(**settings),
        listeners=[listener] if listener else [],
        transform=wordcount.words_of,
    )


def statuses(root: Path) -> list[tuple[int, EpochStatus, int | None]]:
    return [(i.epoch, i.status, i.snapshot_epoch) for i in Snapshots(str(root)).list()]


def assert_counted(spark: SparkSession, root: Path) -> None:
    """Every snapshot's state and sink equal a direct count of its epochs; validate is clean."""
    snapshots = Snapshots(str(root), spark)
    for info in snapshots.list():
        if info.status is C:
            upto = EPOCHS[: info.epoch + 1]
            assert_same(snapshots.state("word_count", info.epoch), expected_state(spark, upto))
            assert_same(snapshots.sink("output", info.epoch), expected_sink(spark, upto))
    assert_same(snapshots.sink("output"), expected_sink(spark, EPOCHS))
    assert validate(str(root)) == []


@pytest.fixture(scope="module")
def reference(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Committed]:
    """A failure-free sync run with interval 3, and what its listener heard."""
    base = tmp_path_factory.mktemp("reference")
    listener = Committed()
    query = interval_pipeline(write_epochs(base / "in", EPOCHS), base / "root", listener)
    query.run()
    return base / "root", listener


def test_sync_run_snapshots_every_third_epoch_and_the_stop_commits_the_open_group(
    spark: SparkSession, reference: tuple[Path, Committed]
) -> None:
    root, listener = reference
    assert statuses(root) == EVERY_THIRD
    assert listener.epochs == [2, 5, 6]
    assert_counted(spark, root)
    store = DeltaStore()
    manifest = store.open(str(root / "_manifest"))
    assert manifest.version() == 7 + 3, "one append per PREPARED epoch and one per snapshot"
    sink = store.open(str(root / "sinks" / "word_counts"))
    assert [c.get(EPOCH_KEY) for c in sink.history() if c.get(EPOCH_KEY)] == ["6", "5", "2"]
    snapshots = Snapshots(str(root), spark)
    infos = {i.epoch: i for i in snapshots.list()}
    state_versions = [infos[e].table_versions["state/word_count"] for e in (2, 5, 6)]
    assert state_versions == [1, 2, 3]
    changes = load_dataframe(spark, str(root / "state" / "word_count"), state_versions[0])
    assert sorted(r["_epoch"] for r in changes.select("_epoch").distinct().collect()) == [0, 1, 2]
    metrics = snapshots.metrics_table().to_pylist()
    assert [(m["epoch"], m["status"], m["snapshot_epoch"]) for m in metrics] == [
        (e, s.value, snapshot) for e, s, snapshot in EVERY_THIRD
    ]
    assert [m["rows_by_table"][0] for m in metrics] == [
        ("sink/output", 3),
        ("sink/output", 3),
        ("sink/output", 4),
        ("sink/output", 5),
        ("sink/output", 2),
        ("sink/output", 2),
        ("sink/output", 3),
    ]
    assert [m["commit_ms"] is not None for m in metrics] == [s is C for _, s, _ in EVERY_THIRD]

    log = open_manifest(store, SnapshotRoot(root), "wordcount")
    lost = FileEntry("sink/output", "abs-lost.parquet", 1, 1, 0)
    damaged = EpochLog(
        replace(e, files=(*e.files, lost))
        if (e.epoch, e.status) == (0, EpochStatus.PREPARED)
        else e
        for e in log.entries
    )
    with pytest.raises(
        SnapshotDamagedError,
        match=r"epoch 2 .* file abs-lost.parquet, which epoch 0 \(merged into this snapshot\) "
        r"prepared, is not in version 1",
    ):
        require_intact(SnapshotRoot(root), damaged, 2, "It cannot be restored.")


def test_async_run_until_quiescent_commits_the_same_groups(
    spark: SparkSession, tmp_path: Path, reference: tuple[Path, Committed]
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    pipeline = interval_pipeline(inputs, tmp_path / "root", commit_mode="async")
    outcome = pipeline.run_until_quiescent()  # drains (commits the open group) while running
    assert (outcome.epoch, outcome.epochs_run) == (6, 7)
    assert statuses(tmp_path / "root") == EVERY_THIRD
    ours, theirs = Snapshots(str(tmp_path / "root"), spark), Snapshots(str(reference[0]), spark)
    assert_same(state_history(ours), state_history(theirs))
    assert_same(ours.sink("output"), theirs.sink("output"))


def test_crash_after_an_intermediate_epoch_is_prepared_then_vacuum_and_restart(
    spark: SparkSession, tmp_path: Path
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    crashing = interval_pipeline(
        inputs, root, commit_mode="async", faults=(Fault(FaultStep.AFTER_PREPARED, 4),)
    )
    with pytest.raises(InjectedFault, match="'after_prepared' of epoch 4"):
        crashing.run()
    P = EpochStatus.PREPARED
    assert statuses(root) == [(0, M, 2), (1, M, 2), (2, C, 2), (3, P, None), (4, P, None)]
    pending = open_manifest(DeltaStore(), SnapshotRoot(root), "wordcount").pending()
    files = [Path(e.tables[f.table]) / f.path for e in pending for f in e.files]
    written = {(e.epoch, f.table) for e in pending for f in e.files}
    assert written == {(e, t) for e in (3, 4) for t in ("state/word_count", "sink/output")}

    report = vacuum(str(root), min_age_seconds=0)
    assert report.kept_in_flight == len(files)
    assert all(f.exists() for f in files), "vacuum deleted files of the open group"

    restarted = interval_pipeline(inputs, root, commit_mode="async").run()
    assert restarted.recovered_epochs == [3, 4]
    assert statuses(root) == [*EVERY_THIRD[:3], (3, M, 4), (4, C, 4), (5, M, 6), (6, C, 6)]
    assert_counted(spark, root)

    report = vacuum(str(root), keep_last=2, min_age_seconds=0)
    assert report.expired == [0, 1, 2]
    assert [s for _, s, _ in statuses(root)][:3] == [EpochStatus.EXPIRED] * 3
    assert validate(str(root)) == []
    with pytest.raises(SnapshotNotFoundError, match=r"epoch 1 .* is EXPIRED; readable .* 4, 6"):
        Snapshots(str(root), spark).state("word_count", 1)
    assert_same(Snapshots(str(root), spark).state("word_count"), expected_state(spark, EPOCHS))


def test_crash_between_the_table_commits_of_a_group_then_restart_and_roll_back(
    spark: SparkSession, tmp_path: Path, reference: tuple[Path, Committed], capsys: Any
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    crashing = interval_pipeline(inputs, root, faults=(Fault(FaultStep.BETWEEN_TABLE_COMMITS, 5),))
    with pytest.raises(InjectedFault, match="'between_table_commits' of epoch 5"):
        crashing.run()
    state, sink = (
        DeltaTable(str(root / "state" / "word_count")),
        DeltaTable(str(root / "sinks" / "word_counts")),
    )
    root_id = manifest_root_id(DeltaStore(), SnapshotRoot(root))
    assert state.transaction_version(app_id("wordcount", "state/word_count", root_id)) == 5
    assert sink.transaction_version(app_id("wordcount", "sink/output", root_id)) == 2

    restarted = interval_pipeline(inputs, root).run()
    assert restarted.recovered_epochs == [3, 4, 5]
    assert statuses(root) == EVERY_THIRD
    snapshots, theirs = Snapshots(str(root), spark), Snapshots(str(reference[0]), spark)
    assert_same(state_history(snapshots), state_history(theirs))
    assert_same(snapshots.sink("output"), theirs.sink("output"))
    assert validate(str(root)) == []

    merged = (
        r"epoch 4 of snapshot root .* is not a snapshot: it was MERGED into snapshot 5 "
        r"\(snapshot_interval 3\), whose commit made its outputs visible. Use epoch 5 or "
        r"another readable epoch: 2, 5\.\.6"
    )
    with pytest.raises(SnapshotNotFoundError, match=merged):
        rollback(str(root), 4)
    with pytest.raises(SnapshotNotFoundError, match=merged):
        snapshots.state("word_count", 4)
    with pytest.raises(SnapshotNotFoundError, match=merged):
        snapshots.sink("output", 4)
    assert cli.main(["state", str(root), "word_count", "--epoch", "4"]) == cli.EXIT_USAGE
    assert "MERGED into snapshot 5" in capsys.readouterr().err

    restored = rollback(str(root), 2)
    assert (restored.epoch, restored.status, restored.restored_from) == (
        7,
        EpochStatus.RESTORED,
        2,
    )
    assert_same(snapshots.state("word_count"), expected_state(spark, EPOCHS[:3]))
    assert_same(snapshots.sink("output"), expected_sink(spark, EPOCHS[:3]))
    assert validate(str(root)) == []


def test_an_interval_is_refused_with_back_edges_and_read_from_spark_conf(
    spark: SparkSession, tmp_path: Path
) -> None:
    table = str(tmp_path / "jobs")
    retry.write_jobs(table, 1)
    with pytest.raises(ConfigError, match="back-edges need snapshot_interval=1, got 2"):
        Pipeline(
            "loops",
            DeltaSource(table),
            retry.retry_operator(3),
            root=str(tmp_path / "r"),
            sinks={"done": str(tmp_path / "d"), "dead_letter": str(tmp_path / "x")},
            back_edges=[BackEdge("retry")],
            transform=retry.first_attempt,
            config=AbsConfig(snapshot_interval=2),
        )
    spark.conf.set("spark.abs.snapshotInterval", "4")
    try:
        assert AbsConfig.from_spark_conf(spark).snapshot_interval == 4
    finally:
        spark.conf.unset("spark.abs.snapshotInterval")
