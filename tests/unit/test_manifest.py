import datetime as dt
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from pyspark_abs.errors import ManifestError, SnapshotNotFoundError
from pyspark_abs.manifest.entries import (
    MANIFEST_SCHEMA,
    EpochDecision,
    EpochStatus,
    ManifestEntry,
    RestorePayload,
    RunPayload,
    check_transition,
    entries_of,
    entries_to_table,
)
from pyspark_abs.manifest.log import (
    EpochLog,
    check_group,
    closes_group,
    epoch_ranges,
    recovery_groups,
)
from pyspark_abs.manifest.table import manifest_spec, open_manifest
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from tests.support.manifest import T0, entry


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (None, EpochStatus.PREPARED),
        (None, EpochStatus.ABORTED),
        (EpochStatus.ABORTED, EpochStatus.ABORTED),
        (EpochStatus.ABORTED, EpochStatus.PREPARED),
        (EpochStatus.PREPARED, EpochStatus.COMMITTED),
        (EpochStatus.PREPARED, EpochStatus.MERGED),
        (EpochStatus.PREPARED, EpochStatus.ABORTED),
        (EpochStatus.MERGED, EpochStatus.EXPIRED),
    ],
)
def test_allowed_transitions(current: EpochStatus | None, new: EpochStatus) -> None:
    check_transition(1, current, new)


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (None, EpochStatus.COMMITTED),
        (EpochStatus.PREPARED, EpochStatus.PREPARED),
        (EpochStatus.COMMITTED, EpochStatus.COMMITTED),
        (EpochStatus.COMMITTED, EpochStatus.PREPARED),
        (EpochStatus.COMMITTED, EpochStatus.ABORTED),
        (EpochStatus.ABORTED, EpochStatus.COMMITTED),
        (None, EpochStatus.MERGED),
        (EpochStatus.ABORTED, EpochStatus.MERGED),
        (EpochStatus.COMMITTED, EpochStatus.MERGED),
        (EpochStatus.MERGED, EpochStatus.COMMITTED),
        (EpochStatus.MERGED, EpochStatus.PREPARED),
        (EpochStatus.MERGED, EpochStatus.MERGED),
        (EpochStatus.EXPIRED, EpochStatus.MERGED),
    ],
)
def test_forbidden_transitions(current: EpochStatus | None, new: EpochStatus) -> None:
    with pytest.raises(ManifestError, match="epoch 7 cannot go from"):
        check_transition(7, current, new)


def test_log_decides_replays() -> None:
    log = EpochLog(
        [
            entry(0, EpochStatus.PREPARED),
            entry(0, EpochStatus.COMMITTED),
            entry(1, EpochStatus.ABORTED),
            entry(1, EpochStatus.PREPARED),
        ]
    )
    assert log.decide(0) is EpochDecision.SKIP_REPLAY
    assert log.decide(1) is EpochDecision.FINISH_REPLAY
    assert log.decide(2) is EpochDecision.PROCESS
    assert [e.epoch for e in log.pending()] == [1]
    assert [e.epoch for e in log.snapshots()] == [0]
    latest = log.latest_decided()
    assert latest is not None
    assert latest.epoch == 1


def test_aborted_epoch_is_processed_again() -> None:
    log = EpochLog([entry(0, EpochStatus.ABORTED)])
    assert log.decide(0) is EpochDecision.PROCESS
    assert log.pending() == []


def test_epochs_are_prepared_in_order() -> None:
    log = EpochLog([entry(5, EpochStatus.PREPARED)])
    with pytest.raises(ManifestError, match="cannot be PREPARED after epoch 5"):
        log.record(entry(4, EpochStatus.PREPARED))


def test_undecided_epoch_older_than_a_decided_one_is_refused() -> None:
    log = EpochLog([entry(5, EpochStatus.PREPARED)])
    with pytest.raises(ManifestError, match="do not belong together"):
        log.decide(3)


def test_a_prepared_epoch_is_aborted_only_with_the_restore_epoch_that_replaces_it() -> None:
    log = EpochLog([entry(0, EpochStatus.PREPARED), entry(0, EpochStatus.COMMITTED)])
    log.record(entry(1, EpochStatus.PREPARED))
    aborted = entry(1, EpochStatus.ABORTED)
    with pytest.raises(ManifestError, match=r"epoch\(s\) 1 are PREPARED: the decision stands"):
        log.check_all([aborted])
    with pytest.raises(ManifestError, match="the decision stands"):
        log.check_all([aborted, entry(2, EpochStatus.PREPARED)])
    log.check_all([aborted, entry(2, EpochStatus.PREPARED, origin="rollback to epoch 0")])


def test_an_abort_after_a_decision_replays_in_commit_order() -> None:
    """Rows that record their manifest version replay in that order, so an epoch a rollback
    replaced stays ABORTED, whichever order the rows come in; older rows put ABORTED first."""
    rows = [
        entry(1, EpochStatus.ABORTED, manifest_version=3),
        entry(1, EpochStatus.PREPARED, manifest_version=2),
        entry(2, EpochStatus.PREPARED, origin="rollback to epoch 0", manifest_version=3),
        entry(1, EpochStatus.ABORTED, manifest_version=1),
    ]
    for order in (rows, rows[::-1]):
        log = EpochLog(order)
        assert log.status(1) is EpochStatus.ABORTED
        assert [e.epoch for e in log.pending()] == [2]
    legacy = EpochLog([entry(1, EpochStatus.PREPARED), entry(1, EpochStatus.ABORTED)])
    assert legacy.status(1) is EpochStatus.PREPARED


@pytest.mark.parametrize("seed", range(25))
def test_random_histories_replay_to_the_status_each_epoch_was_left_in(seed: int) -> None:
    """Failed attempts, commits and rollbacks that replace a decided epoch, as commits of
    the manifest, loaded in any row order: each epoch ends in its last recorded status."""
    rng = random.Random(seed)
    rows: list[ManifestEntry] = []
    model: dict[int, EpochStatus] = {}
    version = epoch = 0

    def commit(*changes: tuple[int, EpochStatus, str | None]) -> None:
        nonlocal version
        version += 1
        for number, status, origin in changes:
            rows.append(entry(number, status, origin=origin, manifest_version=version))
            model[number] = status

    while epoch < 12:
        for _attempt in range(rng.randint(0, 2)):
            commit((epoch, EpochStatus.ABORTED, None))
        commit((epoch, EpochStatus.PREPARED, None))
        if rng.random() < 0.3:  # it could never be committed: a rollback replaces it
            restore = epoch + 1
            commit((epoch, EpochStatus.ABORTED, None), (restore, EpochStatus.PREPARED, "rollback"))
            commit((restore, EpochStatus.RESTORED, "rollback"))
            epoch += 2
        else:
            commit((epoch, EpochStatus.COMMITTED, None))
            epoch += 1
    rng.shuffle(rows)
    log = EpochLog(rows)
    assert {number: log.status(number) for number in model} == model
    assert log.pending() == []
    assert log.duplicates == []


def test_log_replays_entries_in_protocol_order_whatever_the_clock() -> None:
    late = T0 + dt.timedelta(seconds=5)
    committed = entry(0, EpochStatus.COMMITTED)
    prepared = entry(0, recorded_at=late)
    log = EpochLog([committed, prepared])
    assert log.status(0) is EpochStatus.COMMITTED


def test_entry_round_trips_through_arrow() -> None:
    original = entry(
        3,
        EpochStatus.PREPARED,
        tables={"state/wc": "/r/state/wc", "sink/out": "/s"},
        files=(FileEntry("state/wc", "a.parquet", 10, 2, 99, "{}", '{"numRecords": 2}'),),
        rows={"state/wc": 2},
        bytes={"state/wc": 10},
        state_keys=2,
        source_offsets='{"logOffset":3}',
        batch_ms=1.5,
    )
    table = entries_to_table([original])
    assert ManifestEntry.from_row(table.to_pylist()[0]) == original


def test_each_kind_of_entry_round_trips_with_its_payload() -> None:
    run = entry(
        4,
        EpochStatus.PREPARED,
        batch_id=4,
        key_groups=8,
        run=RunPayload(
            checkpoint="/r/_checkpoint", commit_mode="sync", slots=2, snapshot_interval=3
        ),
    )
    restore = entry(
        5,
        EpochStatus.PREPARED,
        restored_from=2,
        origin="rollback to epoch 2",
        restore=RestorePayload(
            versions={"sink/out": 7}, schemas={"state/wc": "{}"}, watermark_after_ms=9, job="/j"
        ),
    )
    tagged = run.transition(EpochStatus.TAGGED, tag="v1")
    rows = entries_to_table([run, restore, tagged]).to_pylist()
    assert [ManifestEntry.from_row(r) for r in rows] == [run, restore, tagged]
    assert rows[1]["restore_versions"] == [("sink/out", 7)]
    assert rows[0]["slots"] == 2
    assert (run.is_restore, restore.is_restore, tagged.run) == (False, True, run.run)


def test_a_restore_payload_goes_with_an_origin() -> None:
    assert entry(5, origin="rollback to epoch 2").restore == RestorePayload()
    assert entry(5).restore is None
    assert entry(5).run is None
    with pytest.raises(ValueError, match="epoch 5: a restore payload needs the origin of it"):
        entry(5, restore=RestorePayload(job="/j"))


def test_entries_read_from_arrow_without_pandas_as_pyarrow_converts_them(tmp_path: Path) -> None:
    later = T0 + dt.timedelta(days=400, microseconds=123_457)
    table = entries_to_table(
        [entry(0), entry(0, EpochStatus.COMMITTED, recorded_at=later), entry(1, batch_ms=2.5)]
    )
    read = entries_of(table)
    assert read == [ManifestEntry.from_row(r) for r in table.to_pylist()]
    assert [e.recorded_at for e in read] == [T0, later, T0]
    assert entries_of(table.to_batches()[0]) == read
    pq.write_table(table, tmp_path / "manifest.parquet")
    code = (
        "import sys, pyarrow.parquet as pq; "
        "from pyspark_abs.manifest.entries import entries_of; "
        f"entries_of(pq.ParquetFile({str(tmp_path / 'manifest.parquet')!r}).read()); "
        "print('pandas' in sys.modules)"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.stdout.strip() == "False", loaded.stderr


def file(table: str, epoch: int) -> FileEntry:
    return FileEntry(table, f"abs-e{epoch}-{table.replace('/', '-')}.parquet", 10, 1, 0)


TABLES = {"state/wc": "/r/state/wc", "sink/out": "/s"}


def prepared(epoch: int, interval: int = 3, tables: dict[str, str] = TABLES) -> ManifestEntry:
    files = tuple(file(t, epoch) for t in tables)
    return entry(
        epoch,
        EpochStatus.PREPARED,
        tables=tables,
        files=files,
        run=RunPayload(snapshot_interval=interval),
    )


def merged(epoch: int, snapshot: int) -> ManifestEntry:
    return prepared(epoch).transition(EpochStatus.MERGED, files=(), snapshot_epoch=snapshot)


def committed(epoch: int) -> ManifestEntry:
    return prepared(epoch).transition(EpochStatus.COMMITTED, files=(), snapshot_epoch=epoch)


def interval_log() -> EpochLog:
    """Interval 3: epochs 0..2 committed as snapshot 2, 3 and 4 PREPARED (an open group)."""
    return EpochLog(
        [
            *(prepared(e) for e in range(5)),
            merged(0, 2),
            merged(1, 2),
            committed(2),
        ]
    )


def test_merged_epochs_are_neither_snapshots_nor_pending_and_their_replays_are_skipped() -> None:
    log = interval_log()
    assert [e.epoch for e in log.snapshots()] == [2]
    assert [e.epoch for e in log.pending()] == [3, 4]
    assert log.decide(0) is EpochDecision.SKIP_REPLAY
    assert log.decide(1) is EpochDecision.SKIP_REPLAY
    assert log.decide(3) is EpochDecision.FINISH_REPLAY
    assert log.merged_into(2) == [0, 1]
    assert [e.epoch for e in log.group(2)] == [0, 1, 2]
    assert all(e.status is EpochStatus.PREPARED and e.files for e in log.group(2))
    expired = log.latest(0)
    assert expired is not None
    log.record(expired.transition(EpochStatus.EXPIRED))
    assert log.merged_into(2) == [0, 1]
    assert log.decide(0) is EpochDecision.SKIP_REPLAY


def test_an_epoch_is_merged_only_into_a_later_snapshot() -> None:
    log = EpochLog([prepared(0), prepared(1)])
    with pytest.raises(ManifestError, match="epoch 1 cannot be MERGED into snapshot 0"):
        log.record(merged(1, 0))
    with pytest.raises(ManifestError, match="epoch 0 cannot be MERGED into snapshot None"):
        log.record(prepared(0).transition(EpochStatus.MERGED, files=()))


def test_reading_a_merged_epoch_names_its_snapshot_and_the_readable_epochs() -> None:
    log = interval_log()
    assert log.require_snapshot(2, SnapshotRoot("/root")).epoch == 2
    with pytest.raises(
        SnapshotNotFoundError,
        match=r"epoch 1 of snapshot root /root is not a snapshot: it was MERGED into snapshot 2 "
        r"\(snapshot_interval 3\).* Use epoch 2 or another readable epoch: 2$",
    ):
        log.require_snapshot(1, SnapshotRoot("/root"))
    with pytest.raises(
        SnapshotNotFoundError, match=r"epoch 3 .* is PREPARED; readable epochs are 2"
    ):
        log.require_snapshot(3, SnapshotRoot("/root"))
    with pytest.raises(SnapshotNotFoundError, match=r"epoch 9 .* is not in the manifest"):
        log.require_snapshot(9, SnapshotRoot("/root"))


@pytest.mark.parametrize(
    ("epoch", "last", "interval", "closes"),
    [
        (0, None, 1, True),
        (0, None, 3, False),
        (1, None, 3, False),
        (2, None, 3, True),
        (3, 2, 3, False),
        (5, 2, 3, True),
        (7, 2, 3, True),
        (8, 7, 1, True),
        (11, 10, 2, False),
    ],
)
def test_an_epoch_closes_a_group_interval_epochs_after_the_last_snapshot(
    epoch: int, last: int | None, interval: int, closes: bool
) -> None:
    assert closes_group(epoch, last, interval) is closes


def epochs_of(groups: list[tuple[ManifestEntry, ...]]) -> list[list[int]]:
    return [[e.epoch for e in g] for g in groups]


def test_recovery_closes_the_groups_the_run_would_have_then_the_rest() -> None:
    pending = [prepared(e) for e in range(3, 9)]
    assert epochs_of(recovery_groups(pending, 2)) == [[3, 4, 5], [6, 7, 8]]
    assert epochs_of(recovery_groups(pending[:2], 2)) == [[3, 4]]
    assert epochs_of(recovery_groups(pending[:4], 2)) == [[3, 4, 5], [6]]
    assert epochs_of(recovery_groups([prepared(e) for e in range(3)], None)) == [[0, 1, 2]]
    every_epoch = [prepared(e, interval=1) for e in range(3, 6)]
    assert epochs_of(recovery_groups(every_epoch, 2)) == [[3], [4], [5]]
    unrecorded = [entry(e, EpochStatus.PREPARED) for e in (3, 4)]
    assert epochs_of(recovery_groups(unrecorded, 2)) == [[3], [4]]


def test_recovery_commits_a_restore_epoch_alone() -> None:
    restore = entry(6, EpochStatus.PREPARED, origin="rollback to epoch 2", tables=TABLES)
    pending = [prepared(3), prepared(4), restore, prepared(7)]
    assert epochs_of(recovery_groups(pending, 2)) == [[3, 4], [6], [7]]


def test_a_group_is_ordered_prepared_and_writes_the_same_tables() -> None:
    check_group([prepared(3), prepared(4), prepared(5)])
    restore = entry(6, EpochStatus.PREPARED, origin="rollback to epoch 2", tables=TABLES)
    check_group([restore])
    bad: list[tuple[list[ManifestEntry], str]] = [
        ([prepared(4), prepared(3)], "not in increasing order"),
        ([prepared(3), prepared(3)], "not in increasing order"),
        ([prepared(3), committed(4)], "not every entry is PREPARED"),
        ([prepared(5), restore], "a restore epoch is committed alone"),
        ([prepared(3), prepared(4, tables={"state/wc": "/r/state/wc"})], "different tables"),
    ]
    for group, problem in bad:
        with pytest.raises(
            ManifestError, match=f"cannot be committed as one snapshot: .*{problem}"
        ):
            check_group(group)
    with pytest.raises(ManifestError, match="at least one PREPARED epoch"):
        check_group([])


def test_epoch_ranges() -> None:
    assert epoch_ranges([9, 0, 1, 2, 4, 10, 11]) == "0..2, 4, 9..11"
    assert epoch_ranges([]) == "none"


def test_a_manifest_without_the_interval_columns_gets_them_on_open(tmp_path: Path) -> None:
    root = str(tmp_path)
    spec = manifest_spec(SnapshotRoot(root), "p")
    old = pa.schema([f for f in MANIFEST_SCHEMA if not f.name.startswith("snapshot_")])
    DeltaTable.create(spec.uri, old, description=spec.description)
    store = DeltaStore()
    rows = entries_to_table([prepared(0), committed(0)]).select(old.names)
    store.append(spec.uri, rows)
    log = open_manifest(store, SnapshotRoot(root), "p")
    assert set(MANIFEST_SCHEMA.names) <= set(DeltaTable(spec.uri).schema().to_arrow().names)
    assert [e.epoch for e in log.snapshots()] == [0]
    store.append(spec.uri, entries_to_table([prepared(1)]))
    assert [e.epoch for e in open_manifest(store, SnapshotRoot(root), "p").pending()] == [1]


def test_a_status_prints_as_its_name() -> None:
    assert f"{EpochStatus.COMMITTED}" == str(EpochStatus.COMMITTED) == "COMMITTED"


def test_a_restore_epoch_knows_the_watermark_the_epoch_after_the_installed_one_ran_with() -> None:
    log = EpochLog()
    for epoch, watermark in [(0, 0), (1, 100), (2, 120)]:
        log.record(entry(epoch, watermark_ms=watermark))
        log.record(entry(epoch, EpochStatus.COMMITTED, watermark_ms=watermark))
    assert (log.watermark_after(0), log.watermark_after(1), log.watermark_after(2)) == (
        100,
        120,
        None,
    )
    restore = entry(3, origin="rollback to epoch 1", restored_from=1, watermark_ms=100)
    log.record(replace(restore, restore=RestorePayload(watermark_after_ms=log.watermark_after(1))))
    assert log.watermark_after(2) is None  # the epoch after 2 is a restore epoch
    assert log.watermark_after(3) == 120  # nothing ran after it yet: what it carries
    installed = log.latest(3)
    assert installed is not None
    assert (installed.watermark_ms, installed.watermark_floor_ms) == (100, 120)
    log.record(entry(4, watermark_ms=130))
    assert log.watermark_after(3) == 130
