"""A snapshot root on local disk with an epoch writer, for protocol tests without Spark."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from pyspark_abs.faults import Fault, FaultInjector
from pyspark_abs.manifest.entries import ManifestEntry, RunPayload
from pyspark_abs.manifest.table import open_manifest
from pyspark_abs.protocol.epoch_writer import EpochWriter, now
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from tests.support.manifest import entry

PIPELINE = "p"
SINK = "sink/out"


def make_root(tmp_path: Path) -> tuple[str, str]:
    """A snapshot root with an empty manifest, and a sink table outside it."""
    root, sink = str(tmp_path / "root"), str(tmp_path / "sink")
    store = DeltaStore()
    store.ensure_root(SnapshotRoot(root))
    open_manifest(store, SnapshotRoot(root), PIPELINE)
    DeltaTable.create(sink, pa.schema([pa.field("word", pa.string())]))
    return root, sink


def writer_of(root: str, run_id: str = "run", faults: tuple[Fault, ...] = ()) -> EpochWriter:
    store = DeltaStore()
    epochs = open_manifest(store, SnapshotRoot(root), PIPELINE)
    return EpochWriter(PIPELINE, SnapshotRoot(root), store, epochs, run_id, FaultInjector(faults))


def prepared(epoch: int, sink: str, interval: int = 2, run_id: str = "run") -> ManifestEntry:
    """A PREPARED epoch with one pre-committed sink file, which is written."""
    (Path(sink) / f"abs-e{epoch:012d}.parquet").write_bytes(b"0123456789")
    return entry(
        epoch,
        pipeline=PIPELINE,
        recorded_at=now(),
        run_id=run_id,
        batch_id=epoch,
        tables={SINK: sink},
        files=(FileEntry(SINK, f"abs-e{epoch:012d}.parquet", 10, 1, 0),),
        run=RunPayload(snapshot_interval=interval),
    )


def committed_root(tmp_path: Path, epochs: int) -> tuple[str, str, EpochWriter]:
    """A root whose epochs ``0 .. epochs - 1`` are committed, with its writer."""
    root, sink = make_root(tmp_path)
    writer = writer_of(root)
    for epoch in range(epochs):
        writer.record(prepared(epoch, sink, interval=1))
        done = writer.epochs.prepared(epoch)
        assert done is not None
        writer.commit([done])
    return root, sink, writer
