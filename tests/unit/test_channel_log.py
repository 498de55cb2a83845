"""Following an upstream manifest: full once, then only what new versions append."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from deltalake import DeltaTable

from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry, entries_to_table
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import load_epoch_log, manifest_spec
from pyspark_abs.sources.channel.log import ManifestFollower
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.rewrites import compact_small_files
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore

NOW = dt.datetime(2026, 11, 25, tzinfo=dt.timezone.utc)


def _epoch(store: DeltaStore, uri: str, epoch: int, version: int) -> int:
    """Record epoch ``epoch`` PREPARED, then COMMITTED: two appends, as a run makes them."""
    files = (FileEntry("sink/output", f"abs-e{epoch:012d}-0.parquet", 100, 3, 1),)
    prepared = ManifestEntry(
        pipeline="up",
        epoch=epoch,
        status=EpochStatus.PREPARED,
        recorded_at=NOW,
        run_id="run",
        files=files,
    )
    version = store.append(uri, entries_to_table([prepared]), version)
    committed = prepared.transition(
        EpochStatus.COMMITTED, table_versions={"sink/output": epoch + 1}, snapshot_epoch=epoch
    )
    return store.append(uri, entries_to_table([committed]), version)


def _statuses(log: EpochLog | None) -> list[tuple[int, str, int]]:
    assert log is not None
    return sorted((e.epoch, e.status.value, len(e.files)) for e in log.entries)


def test_new_versions_are_read_alone_and_a_rewrite_makes_a_full_read(tmp_path: Path) -> None:
    store = DeltaStore()
    root = str(tmp_path / "up")
    store.ensure_root(SnapshotRoot(root))
    spec = manifest_spec(SnapshotRoot(root), "up")
    follower = ManifestFollower(SnapshotRoot(root))
    assert follower.read(store) is None, "no manifest yet"
    store.ensure_table(spec)
    version = 0
    for epoch in range(3):
        version = _epoch(store, spec.uri, epoch, version)
    first = follower.read(store)
    assert first is not None
    assert first.version == version
    for epoch in range(3, 6):
        version = _epoch(store, spec.uri, epoch, version)
        followed = follower.read(store)
        assert _statuses(followed) == _statuses(load_epoch_log(store, spec.uri))
    assert follower.full_reads == 1, "appends are read on their own"
    assert follower.read(store) is followed, "an unchanged version is not read again"
    compact_small_files(spec.uri)  # rows rewritten, none added: nothing new to fold in
    assert _statuses(follower.read(store)) == _statuses(load_epoch_log(store, spec.uri))
    assert follower.full_reads == 1
    DeltaTable(spec.uri).delete("epoch = 0")  # a version that removes rows
    assert _statuses(follower.read(store)) == _statuses(load_epoch_log(store, spec.uri))
    assert follower.full_reads == 2
    assert 0 not in {e.epoch for e in follower.read(store).entries}  # type: ignore[union-attr]


class _CountingStore(DeltaStore):
    """The store, counting how often a table is brought up to date."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = 0

    def open(self, uri: str) -> DeltaTable:
        self.opened += 1
        return super().open(uri)


def test_a_reader_polling_an_unchanged_manifest_only_looks_for_its_next_commit(
    tmp_path: Path,
) -> None:
    """A stream asks for new epochs between micro-batches, a hundred times a second while
    it waits: no poll may bring the table up to date (a listing of its whole log)."""
    store = _CountingStore()
    root = str(tmp_path / "up")
    store.ensure_root(SnapshotRoot(root))
    spec = manifest_spec(SnapshotRoot(root), "up")
    store.ensure_table(spec)
    version = _epoch(store, spec.uri, 0, 0)
    follower = ManifestFollower(SnapshotRoot(root))
    first = follower.read(store)
    opened = store.opened
    assert all(follower.read(store) is first for _ in range(20))
    assert store.opened == opened, "an unchanged manifest is not opened again"
    version = _epoch(store, spec.uri, 1, version)
    followed = follower.read(store)
    assert followed is not None
    assert followed.version == version
    assert _statuses(followed) == _statuses(load_epoch_log(store, spec.uri))
    assert (store.opened, follower.full_reads) == (opened, 1), "appends are read on their own"
