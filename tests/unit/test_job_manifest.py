"""The job manifest: records fold in the order its commits appended them, whatever the clocks."""

import datetime as dt
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pyspark_abs.errors import ConcurrentWriteError
from pyspark_abs.install.installing import StateInstall
from pyspark_abs.job_ledger.listing import job_origins
from pyspark_abs.job_ledger.manifest import (
    DecisionStatus,
    JobDecision,
    JobRecord,
    open_job,
    record,
    record_decisions,
)
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore


def clock(monkeypatch: pytest.MonkeyPatch, minutes: float) -> None:
    """Record job rows as a host whose clock is off by ``minutes`` would."""
    real = dt.datetime.now
    monkeypatch.setattr(
        "pyspark_abs.job_ledger.manifest.now",
        lambda: real(dt.timezone.utc) + dt.timedelta(minutes=minutes),
    )


def test_a_rollback_finished_by_a_host_whose_clock_is_behind_is_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DeltaStore()
    manifest = open_job(store, SnapshotRoot(tmp_path / "job"), "j")
    manifest = record(store, manifest, record=JobRecord.STAGES.value, stages={"a": "/a"})
    decided = JobDecision(JobRecord.ROLLBACK, 1, 3, {"a": 1}, DecisionStatus.PREPARED)
    manifest = record_decisions(store, manifest, decided)
    assert manifest.unfinished == decided
    clock(monkeypatch, -30)
    manifest = record_decisions(store, manifest, replace(decided, status=DecisionStatus.COMMITTED))
    assert manifest.unfinished is None
    again = open_job(store, SnapshotRoot(tmp_path / "job"), None)
    assert again.unfinished is None
    assert again.decisions[-1].status is DecisionStatus.COMMITTED
    clock(monkeypatch, -60)
    again = record(store, again, record=JobRecord.STAGES.value, stages={"a": "/a", "b": "/b"})
    assert open_job(store, SnapshotRoot(tmp_path / "job"), None).stages == {"a": "/a", "b": "/b"}


def test_a_record_against_a_stale_version_is_refused(tmp_path: Path) -> None:
    store = DeltaStore()
    stale = open_job(store, SnapshotRoot(tmp_path / "job"), "j")
    record(store, stale, record=JobRecord.STAGES.value, stages={"a": "/a"})
    with pytest.raises(ConcurrentWriteError):
        record(store, stale, record=JobRecord.STAGES.value, stages={"b": "/b"})


def test_a_decision_abandoned_and_decided_again_folds_to_the_new_one(tmp_path: Path) -> None:
    store = DeltaStore()
    manifest = open_job(store, SnapshotRoot(tmp_path / "job"), "j")
    state = StateInstall(
        "state/dedup",
        "/r/state/dedup",
        (FileEntry("state/dedup", "abs-e3.parquet", 10, 2, 7),),
        2,
        '{"type":"struct","fields":[]}',
        4,
        "state of operator 'dedup' migrated",
    )
    assert StateInstall.from_json(state.to_json()) == state
    decided = JobDecision(
        JobRecord.MIGRATE, 2, 3, {"a": 2}, DecisionStatus.PREPARED, states={"a": state.to_json()}
    )
    manifest = record_decisions(store, manifest, decided)
    abandoned, again = (
        replace(decided, status=DecisionStatus.ABANDONED),
        replace(decided, restore_epoch=5),
    )
    stale = manifest
    manifest = record_decisions(store, manifest, abandoned, again)
    assert manifest.version == stale.version + 1  # one commit: both rows or neither
    read = open_job(store, SnapshotRoot(tmp_path / "job"), None)
    assert read.unfinished == again
    assert [d.status for d in read.decisions] == [DecisionStatus.ABANDONED, DecisionStatus.PREPARED]
    assert StateInstall.from_json(read.unfinished.states["a"]) == state
    with pytest.raises(ConcurrentWriteError):
        record_decisions(store, stale, abandoned, replace(decided, restore_epoch=6))
    assert open_job(store, SnapshotRoot(tmp_path / "job"), None) == read


def test_job_snapshots_made_by_a_decision_say_which() -> None:
    def decided(kind: JobRecord, status: DecisionStatus, **more: Any) -> JobDecision:
        return JobDecision(kind, 1, 4, {"bronze": 1}, status, **more)

    origins = job_origins(
        [
            decided(JobRecord.ROLLBACK, DecisionStatus.COMMITTED),
            replace(decided(JobRecord.ROLLBACK, DecisionStatus.ABANDONED), restore_epoch=5),
            replace(
                decided(JobRecord.MIGRATE, DecisionStatus.COMMITTED, states={"silver": "{}"}),
                restore_epoch=6,
            ),
            replace(
                decided(JobRecord.RESTORE, DecisionStatus.COMMITTED, source="/jobs/a"),
                restore_epoch=7,
            ),
        ]
    )
    assert origins == {
        4: "rollback to 1",
        6: "state migration of silver",
        7: "restore of /jobs/a at 1",
    }
