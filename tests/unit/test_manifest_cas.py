"""Manifest appends are compare-and-swap, and a manifest with duplicated transitions loads.

Writers race on real delta-rs manifests in tmp_path: stale writers (loaded before another
appended) and threads released together by a barrier.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest

from pyspark_abs.errors import ManifestError
from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry, entries_to_table
from pyspark_abs.manifest.table import open_manifest
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.retention import expire
from tests.support.inputs import race
from tests.support.manifest import T0
from tests.support.roots import PIPELINE, committed_root, make_root, prepared, writer_of


def known(entry: ManifestEntry | None) -> ManifestEntry:
    assert entry is not None
    return entry


def raw_statuses(root: str) -> Counter[tuple[int, str]]:
    """How often each (epoch, status) is in the manifest table, duplicates included."""
    rows = DeltaStore().read(f"{root}/_manifest", columns=["epoch", "status"]).to_pylist()
    return Counter((r["epoch"], r["status"]) for r in rows)


def test_a_stale_writer_cannot_record_a_transition_another_recorded(tmp_path: Path) -> None:
    root, sink = make_root(tmp_path)
    first, second = writer_of(root, "first"), writer_of(root, "second")
    first.record(prepared(0, sink, run_id="first"))
    with pytest.raises(
        ManifestError,
        match=r"epoch 0: PREPARED is not recorded at snapshot root .*: another writer "
        r"recorded PREPARED for epoch 0 \(run first, ",
    ):
        second.record(prepared(0, sink, run_id="second"))
    assert raw_statuses(root) == {(0, "PREPARED"): 1}
    # The loser's log is the reloaded one: it knows epoch 0 now.
    assert second.epochs.status(0) is EpochStatus.PREPARED
    assert second.epochs.version == first.epochs.version


def test_a_stale_writer_whose_transition_is_still_allowed_retries(tmp_path: Path) -> None:
    root, sink = make_root(tmp_path)
    first, second = writer_of(root, "first"), writer_of(root, "second")
    first.record(prepared(0, sink, run_id="first"))
    second.record(prepared(1, sink, run_id="second"))
    assert raw_statuses(root) == {(0, "PREPARED"): 1, (1, "PREPARED"): 1}
    assert [e.epoch for e in second.epochs.pending()] == [0, 1]
    assert [
        e.epoch for e in open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE).pending()
    ] == [0, 1]


def test_threads_racing_to_prepare_one_epoch_record_it_once(tmp_path: Path) -> None:
    root, sink = make_root(tmp_path)
    for epoch in range(6):
        writers = [writer_of(root, f"w{i}") for i in range(3)]
        entries = [prepared(epoch, sink, run_id=w.run_id) for w in writers]
        outcomes = race(*(partial(w.record, e) for w, e in zip(writers, entries, strict=True)))
        assert sum(o is None for o in outcomes) == 1, outcomes
        assert all(o is None or isinstance(o, ManifestError) for o in outcomes), outcomes
    assert set(raw_statuses(root).values()) == {1}
    assert [
        e.epoch for e in open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE).pending()
    ] == list(range(6))


def test_a_zombie_cannot_record_a_second_committed(tmp_path: Path) -> None:
    """The takeover commits epoch 0 first; the zombie's table commits are no-ops."""
    root, sink = make_root(tmp_path)
    zombie = writer_of(root, "zombie")
    zombie.record(prepared(0, sink, interval=1, run_id="zombie"))
    stale = writer_of(root, "stale")
    takeover = writer_of(root, "takeover")
    assert takeover.recover() == [0]
    outcome = zombie.commit([known(zombie.epochs.prepared(0))])
    assert raw_statuses(root) == {(0, "PREPARED"): 1, (0, "COMMITTED"): 1}
    recorded = known(open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE).latest(0))
    assert recorded.run_id == "takeover"
    assert outcome.table_versions == recorded.table_versions
    # A stale writer whose outcome differs from the recorded one is refused.
    other = replace(outcome, table_versions={"sink/out": 7}, run_id="stale")
    with pytest.raises(
        ManifestError, match=r"another writer recorded COMMITTED for epoch 0 \(run takeover"
    ):
        stale.record(other)
    assert raw_statuses(root)[(0, "COMMITTED")] == 1


def test_concurrent_expires_mark_each_epoch_expired_once(tmp_path: Path) -> None:
    root, sink, writer = committed_root(tmp_path, 2)
    for epoch in range(2, 8):
        writer.record(prepared(epoch, sink, interval=1))
        writer.commit([known(writer.epochs.prepared(epoch))])
        outcomes = race(lambda: expire(root, 1), lambda: expire(root, 1))
        assert outcomes == [None, None]
    counts = raw_statuses(root)
    assert {e for (e, s), n in counts.items() if s == "EXPIRED" and n == 1} == set(range(7))
    assert all(n == 1 for n in counts.values()), counts
    epochs = open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE)
    assert [e.epoch for e in epochs.snapshots()] == [7]
    assert epochs.duplicates == []


def later(entry: ManifestEntry) -> dt.datetime:
    return entry.recorded_at + dt.timedelta(seconds=1)


def test_a_manifest_with_duplicated_transitions_still_loads(tmp_path: Path) -> None:
    """Written the old way: plain appends, as two vacuums or rollbacks used to."""
    root, sink, writer = committed_root(tmp_path, 2)
    store, uri = DeltaStore(), f"{root}/_manifest"

    def append(row: ManifestEntry) -> None:
        """A plain append, stamped with the version it creates, as the writer stamps rows."""
        version = int(store.open(uri).version()) + 1
        store.append(uri, entries_to_table([replace(row, manifest_version=version)]))

    expired = known(writer.epochs.latest(0)).transition(EpochStatus.EXPIRED, run_id="vacuum-1")
    append(expired)
    append(replace(expired, run_id="vacuum-2", recorded_at=later(expired)))
    restore = replace(prepared(2, sink), origin="rollback", restored_from=1, run_id="rb-1")
    append(restore)
    # the later rows carry earlier clocks: the order is the manifest's, not the writers'
    append(replace(restore, restored_from=0, run_id="rb-2", recorded_at=T0))
    zombie = known(writer.epochs.latest(1))
    append(replace(zombie, run_id="zombie", recorded_at=T0))

    epochs = open_manifest(store, SnapshotRoot(root), PIPELINE)
    assert known(epochs.latest(0)).run_id == "vacuum-1"
    assert known(epochs.prepared(2)).restored_from == 1
    assert known(epochs.latest(1)).run_id == "run"
    assert sorted(e.run_id for e in epochs.duplicates) == ["rb-2", "vacuum-2", "zombie"]
    assert [e.epoch for e in epochs.pending()] == [2]
    # The root works again: recovery commits the restore epoch the first rollback prepared.
    again = writer_of(root, "next")
    assert again.recover() == [2]
    assert open_manifest(store, SnapshotRoot(root), PIPELINE).status(2) is EpochStatus.RESTORED


def test_a_conflicting_transition_that_is_no_duplicate_still_fails_to_load(
    tmp_path: Path,
) -> None:
    root, _, writer = committed_root(tmp_path, 1)
    merged = known(writer.epochs.latest(0)).transition(
        EpochStatus.MERGED, snapshot_epoch=1, manifest_version=4
    )
    DeltaStore().append(f"{root}/_manifest", entries_to_table([merged]))
    with pytest.raises(ManifestError, match="epoch 0 cannot go from COMMITTED to MERGED"):
        open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE)
