"""What one epoch of a snapshot root says: its status, tables, figures and timings."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry


@dataclass(frozen=True)
class SnapshotInfo:
    """One epoch of a snapshot root.

    Attributes:
        epoch: The epoch.
        status: The epoch's latest status: COMMITTED or RESTORED (a snapshot), MERGED
            (committed as part of a later snapshot), PREPARED, ABORTED or EXPIRED.
        recorded_at: When the epoch reached its status.
        table_versions: Delta version of each table as of the epoch (snapshots only).
        rows: Rows the epoch wrote per table.
        bytes: Bytes the epoch wrote per table.
        state_keys: Live keys in the operator's state after the epoch.
        batch_ms: Processing plus pre-commit time.
        precommit_ms: The slowest task's time writing files.
        align_wait_ms: Time between the first and the last partition's barrier marker.
        align_ms: Time to align markers and verify files.
        prepare_ms: Time to record PREPARED.
        commit_ms: Time to commit the tables (for a snapshot, of its whole group).
        pending_epochs: Earlier epochs PREPARED and not committed yet when this one was
            PREPARED: waiting for the background committer (async mode) or for their
            group to close (``snapshot_interval`` > 1).
        query_id: Spark's id of the checkpoint that ran the epoch, as in
            ``StreamingQueryProgress.id``.
        batch_id: Spark's micro-batch id, as in ``StreamingQueryProgress.batchId``.
        watermark_ms: The epoch's event-time watermark.
        source_offsets: The source offsets Spark recorded for the epoch.
        error: Why the epoch was aborted.
        restored_from: Restore epochs: the epoch whose snapshot they installed.
        origin: Restore epochs: what installed them (rollback, restore, write_state).
        snapshot_epoch: The snapshot whose commit made the epoch's outputs visible: the
            epoch itself for a snapshot, the end of its group for a MERGED epoch; None
            before the commit.
        tags: The names of the snapshot (named savepoints), sorted.
    """

    epoch: int
    status: EpochStatus
    recorded_at: dt.datetime
    table_versions: Mapping[str, int] = field(default_factory=dict)
    rows: Mapping[str, int] = field(default_factory=dict)
    bytes: Mapping[str, int] = field(default_factory=dict)
    state_keys: int | None = None
    batch_ms: float | None = None
    precommit_ms: float | None = None
    align_wait_ms: float | None = None
    align_ms: float | None = None
    prepare_ms: float | None = None
    commit_ms: float | None = None
    pending_epochs: int | None = None
    query_id: str | None = None
    batch_id: int | None = None
    watermark_ms: int | None = None
    source_offsets: str | None = None
    error: str | None = None
    restored_from: int | None = None
    origin: str | None = None
    snapshot_epoch: int | None = None
    tags: tuple[str, ...] = ()

    @classmethod
    def from_entry(cls, entry: ManifestEntry, tags: Sequence[str] = ()) -> SnapshotInfo:
        """The snapshot view of an epoch's latest manifest entry, with its names."""
        return cls(
            epoch=entry.epoch,
            status=entry.status,
            recorded_at=entry.recorded_at,
            table_versions=dict(entry.table_versions),
            rows=dict(entry.rows),
            bytes=dict(entry.bytes),
            state_keys=entry.state_keys,
            batch_ms=entry.batch_ms,
            precommit_ms=entry.precommit_ms,
            align_wait_ms=entry.align_wait_ms,
            align_ms=entry.align_ms,
            prepare_ms=entry.prepare_ms,
            commit_ms=entry.commit_ms,
            pending_epochs=entry.pending_epochs,
            query_id=entry.query_id,
            batch_id=entry.batch_id,
            watermark_ms=entry.watermark_ms,
            source_offsets=entry.source_offsets,
            error=entry.error,
            restored_from=entry.restored_from,
            origin=entry.origin,
            snapshot_epoch=entry.snapshot_epoch,
            tags=tuple(tags),
        )

    def to_dict(self) -> dict[str, Any]:
        """The epoch as a JSON-ready dict (status as text, time in ISO 8601)."""
        data = asdict(self)
        data["status"] = self.status.value
        data["recorded_at"] = self.recorded_at.isoformat()
        data["tags"] = list(self.tags)
        return data
