"""The coordinator's open group: a drain from another thread never reorders or repeats a commit.

Real manifest and Delta commits (delta-rs, no Spark): one thread decides epochs the way
micro-batches do, another drains (commits the open group) meanwhile, in both commit modes.
"""

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from pyspark_abs.config import AbsConfig, CommitMode
from pyspark_abs.manifest.entries import RunPayload
from pyspark_abs.manifest.table import open_manifest
from pyspark_abs.operators.envelope import Kind
from pyspark_abs.protocol.coordinator import EpochCoordinator
from pyspark_abs.protocol.epoch_writer import EpochWriter, now
from pyspark_abs.protocol.layout import SnapshotLayout
from pyspark_abs.protocol.precommit import TableTarget
from pyspark_abs.protocol.spark_checkpoint import ArrowFiles, CheckpointReader
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from tests.support.manifest import entry

EPOCHS = 24
SCHEMA = pa.schema([pa.field("word", pa.string())])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_drains_during_micro_batches_commit_every_epoch_once_in_order(
    tmp_path: Path, mode: CommitMode
) -> None:
    root = str(tmp_path)
    sink = f"{root}/sink"
    DeltaTable.create(sink, SCHEMA)
    store = DeltaStore()
    writer = EpochWriter(
        "p", SnapshotRoot(root), store, open_manifest(store, SnapshotRoot(root), "p"), "run"
    )
    config = AbsConfig(commit_mode=mode, snapshot_interval=5, max_pending_epochs=1)
    target = TableTarget("sink/out", sink, Kind.OUTPUT, 0, SCHEMA, SCHEMA)
    coordinator = EpochCoordinator(
        SnapshotLayout("p", SnapshotRoot(root), "op", (target,)),
        config,
        writer,
        CheckpointReader(f"{root}/_checkpoint", ArrowFiles()),
    )
    done = threading.Event()

    def micro_batches() -> None:
        for epoch in range(EPOCHS):
            # phase 2 commits only files that are there, at their recorded size
            Path(sink, f"e{epoch}.parquet").write_bytes(b"0123456789")
            prepared = entry(
                epoch,
                recorded_at=now(),
                run_id="run",
                tables={"sink/out": sink},
                files=(FileEntry("sink/out", f"e{epoch}.parquet", 10, 1, 0),),
                run=RunPayload(snapshot_interval=5),
            )
            writer.record(prepared)
            coordinator._join_group(prepared)
        done.set()

    thread = threading.Thread(target=micro_batches)
    thread.start()
    drains = 0
    while not done.is_set():
        coordinator.drain()
        drains += 1
    thread.join()
    coordinator.drain()
    coordinator.close()

    log = open_manifest(store, SnapshotRoot(root), "p")
    assert log.pending() == []
    snapshots = [e.epoch for e in log.snapshots()]
    assert snapshots[-1] == EPOCHS - 1
    assert snapshots == sorted(snapshots)
    groups = [[*log.merged_into(s), s] for s in snapshots]
    assert [e for g in groups for e in g] == list(range(EPOCHS)), "each epoch in one group"
    assert all(len(g) <= 5 for g in groups)
    assert drains > 1
    table = DeltaTable(sink)
    committed = [int(c["pyspark_abs.epoch"]) for c in reversed(table.history()) if c["version"]]
    assert committed == snapshots, "one Delta commit per snapshot, in epoch order"
    added = [str(p) for p in pa.table(table.get_add_actions(flatten=True)).column("path")]
    assert sorted(added) == sorted(f"e{e}.parquet" for e in range(EPOCHS))
