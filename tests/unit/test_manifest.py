import datetime as dt

import pytest

from pyspark_abs.barrier import FileEntry
from pyspark_abs.errors import ManifestError
from pyspark_abs.manifest import (
    EpochDecision,
    EpochLog,
    EpochStatus,
    ManifestEntry,
    check_transition,
    entries_to_table,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def entry(epoch: int, status: EpochStatus, **kw: object) -> ManifestEntry:
    return ManifestEntry(
        pipeline="p",
        epoch=epoch,
        status=status,
        recorded_at=T0,
        run_id="r",
        **kw,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (None, EpochStatus.PREPARED),
        (None, EpochStatus.ABORTED),
        (EpochStatus.ABORTED, EpochStatus.ABORTED),
        (EpochStatus.ABORTED, EpochStatus.PREPARED),
        (EpochStatus.PREPARED, EpochStatus.COMMITTED),
    ],
)
def test_allowed_transitions(current: EpochStatus | None, new: EpochStatus) -> None:
    check_transition(1, current, new)


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (None, EpochStatus.COMMITTED),
        (EpochStatus.PREPARED, EpochStatus.PREPARED),
        (EpochStatus.PREPARED, EpochStatus.ABORTED),
        (EpochStatus.COMMITTED, EpochStatus.COMMITTED),
        (EpochStatus.COMMITTED, EpochStatus.PREPARED),
        (EpochStatus.COMMITTED, EpochStatus.ABORTED),
        (EpochStatus.ABORTED, EpochStatus.COMMITTED),
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


def test_log_replays_entries_in_protocol_order_whatever_the_clock() -> None:
    late = T0 + dt.timedelta(seconds=5)
    committed = ManifestEntry("p", 0, EpochStatus.COMMITTED, T0, "r")
    prepared = ManifestEntry("p", 0, EpochStatus.PREPARED, late, "r")
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
