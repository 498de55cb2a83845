"""EpochWriter on real Delta tables: groups commit in order, a failed group poisons the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from deltalake import DeltaTable

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import CommitError, InjectedFault, ManifestError
from pyspark_abs.faults import Fault, FaultStep
from pyspark_abs.manifest.table import open_manifest
from pyspark_abs.protocol.coordinator import EpochCoordinator
from pyspark_abs.protocol.epoch_writer import EpochWriter
from pyspark_abs.protocol.layout import SnapshotLayout
from pyspark_abs.protocol.spark_checkpoint import ArrowFiles, CheckpointReader
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from tests.support.roots import PIPELINE, SINK, make_root, prepared, writer_of


def statuses(root: str) -> list[tuple[int, str]]:
    epochs = open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE)
    return [(e.epoch, e.status.value) for e in epochs.entries]


def test_a_group_is_not_committed_past_an_earlier_pending_epoch(tmp_path: Path) -> None:
    root, sink = make_root(tmp_path)
    writer = writer_of(root)
    writer.record_all([prepared(0, sink)])
    writer.record_all([prepared(1, sink)])
    writer.record_all([prepared(2, sink)])
    with pytest.raises(
        ManifestError,
        match=r"epoch\(s\) 1\.\.2 cannot be committed at snapshot root .*root: earlier "
        r"epoch\(s\) 0 are PREPARED and not committed yet",
    ):
        writer.commit([writer.epochs.prepared(1), writer.epochs.prepared(2)])  # type: ignore[list-item]
    with pytest.raises(ManifestError, match=r"earlier epoch\(s\) 1 are PREPARED"):
        writer.commit([writer.epochs.prepared(0), writer.epochs.prepared(2)])  # type: ignore[list-item]
    assert DeltaTable(sink).version() == 0  # no table was touched
    assert writer.recover() == [0, 1, 2]
    assert DeltaTable(sink).transaction_version(writer.app_id(SINK)) == 2


def coordinator(root: str, writer: EpochWriter, tmp_path: Path) -> EpochCoordinator:
    config = AbsConfig(commit_mode="sync", snapshot_interval=2, compaction_ratio=0)
    layout = SnapshotLayout(PIPELINE, SnapshotRoot(root), "op")
    checkpoint = CheckpointReader(str(tmp_path / "checkpoint"), ArrowFiles())
    return EpochCoordinator(layout, config, writer, checkpoint)


def test_a_failed_group_commit_poisons_a_sync_run(tmp_path: Path) -> None:
    """Sync mode, interval 2: a drain whose commit fails stops every later group."""
    root, sink = make_root(tmp_path)
    writer = writer_of(root, faults=(Fault(FaultStep.BETWEEN_TABLE_COMMITS, 0),))
    run = coordinator(root, writer, tmp_path)
    first = prepared(0, sink)
    writer.record(first)
    run._join_group(first)  # epoch 0 does not close a group of two
    with pytest.raises(InjectedFault):
        run.drain()  # commits the open group [0] alone: it fails
    assert isinstance(run.failure, InjectedFault)
    with pytest.raises(CommitError, match=r"epoch 1 is refused: run run of pipeline 'p' failed"):
        run.process_batch(cast(Any, None), 1)
    with pytest.raises(CommitError, match="the drain of the open group is refused"):
        run.drain()
    # Even a writer that skipped the coordinator cannot commit a later group past epoch 0.
    for epoch in (1, 2):
        writer.record(prepared(epoch, sink))
    with pytest.raises(ManifestError, match=r"earlier epoch\(s\) 0 are PREPARED"):
        writer.commit([writer.epochs.prepared(1), writer.epochs.prepared(2)])  # type: ignore[list-item]
    run.close()
    # The next start commits the pending epochs in order.
    assert writer_of(root, "next").recover() == [0, 1, 2]
    assert [s for s in statuses(root) if s[1] != "PREPARED"] == [
        (0, "MERGED"),
        (1, "COMMITTED"),
        (2, "COMMITTED"),
    ]
