"""A snapshot root copied as a directory keeps the original's id: it must not write the
original's sinks, while a root that was moved (nothing left at the old place) may."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest
from deltalake import DeltaTable

from pyspark_abs.errors import PipelineMismatchError
from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry
from pyspark_abs.manifest.relocation import moved_prefix, relocated
from pyspark_abs.manifest.table import manifest_root_id, open_manifest
from pyspark_abs.pipeline.savepoints import rollback
from pyspark_abs.protocol.lineage import require_own_sinks
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from tests.support.roots import PIPELINE, SINK, committed_root


def test_a_copy_may_not_write_the_originals_sink_but_a_moved_root_may(tmp_path: Path) -> None:
    root, sink, _ = committed_root(tmp_path / "a", 3)
    store = DeltaStore()
    root_id = manifest_root_id(store, SnapshotRoot(root))
    copy = str(tmp_path / "copy")
    shutil.copytree(root, copy)
    assert manifest_root_id(store, SnapshotRoot(copy)) == root_id
    require_own_sinks(store, PIPELINE, SnapshotRoot(root), root_id, {SINK: sink}, 2)
    with pytest.raises(PipelineMismatchError, match=r"is a copy of .*/a/root .* own sink"):
        require_own_sinks(store, PIPELINE, SnapshotRoot(copy), root_id, {SINK: sink}, 2)
    require_own_sinks(
        store, PIPELINE, SnapshotRoot(copy), root_id, {SINK: str(tmp_path / "new-sink")}, 2
    )
    own_copy = str(tmp_path / "copied-sink")  # the sink copied with the root is the copy's
    shutil.copytree(sink, own_copy)
    require_own_sinks(store, PIPELINE, SnapshotRoot(copy), root_id, {SINK: own_copy}, 2)
    shutil.rmtree(root)  # a move: the copy is the root now
    require_own_sinks(store, PIPELINE, SnapshotRoot(copy), root_id, {SINK: sink}, 2)


def test_a_copy_may_not_roll_back_the_originals_sink(tmp_path: Path) -> None:
    root, sink, _ = committed_root(tmp_path / "a", 3)
    copy = str(tmp_path / "copy")
    shutil.copytree(root, copy)
    before = DeltaTable(sink).version()
    with pytest.raises(PipelineMismatchError, match=r"is a copy of .*/a/root .* own sink"):
        rollback(copy, 1)
    assert DeltaTable(sink).version() == before
    assert open_manifest(DeltaStore(), SnapshotRoot(copy), PIPELINE).latest_decided().epoch == 2  # type: ignore[union-attr]
    rollback(root, 1)  # the original may
    assert DeltaTable(sink).version() == before + 1


def test_entries_written_elsewhere_name_their_tables_where_the_copy_is() -> None:
    entry = ManifestEntry(
        pipeline="p",
        epoch=3,
        status=EpochStatus.COMMITTED,
        recorded_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
        run_id="r",
        tables={
            "state/op": "/data/job-1/stages/s/state/op",
            "sink/out": "/data/job-1/tables/s",
            "sink/shared": "/elsewhere/t",
        },
    )
    (moved,) = relocated(SnapshotRoot("/data/job-2/stages/s"), [entry])
    assert dict(moved.tables) == {
        "state/op": "/data/job-2/stages/s/state/op",
        "sink/out": "/data/job-2/tables/s",
        "sink/shared": "/elsewhere/t",
    }
    (same,) = relocated(SnapshotRoot("/data/job-1/stages/s"), [entry])
    assert same is entry
    assert moved_prefix("s3://b/x/root", "s3://c/y/root") == ("s3://b/x", "s3://c/y")
