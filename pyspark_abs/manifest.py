"""The manifest: the durable log of epoch transitions, and its state machine.

The manifest is a Delta table (``_manifest`` under the snapshot root) with one row per
transition of an epoch. Appending PREPARED is the decision point of the two-phase commit:
from then on the epoch will be committed, at the latest by recovery. COMMITTED records the
Delta version of every table, which together form the consistent cut of the epoch.

Allowed transitions of one epoch::

    (none) ──► PREPARED ──► COMMITTED ──► EXPIRED
       │          ▲     ├─► RESTORED ──┤
       └► ABORTED ┘     └─► MERGED ────┘
                      (an aborted epoch is replayed by Spark and may be prepared again)

With a snapshot interval N (``AbsConfig.snapshot_interval``), PREPARED epochs are committed
in *groups*: epoch s closes a group when ``s - last >= N`` (:func:`closes_group`), where
``last`` is the newest snapshot (or group end). One Delta transaction per table, with
application transaction version s, commits the files of every epoch of the group; then one
manifest append records COMMITTED for s, whose table versions are the snapshot, and MERGED
for each earlier epoch of the group, with ``snapshot_epoch`` = s. A MERGED epoch is neither a
snapshot nor pending, and Spark's replay of it is discarded. With N = 1 every group is one
epoch and no epoch is MERGED.

A restore epoch (rollback, restore into another root, written state) is PREPARED with the
state to install and the table versions to go back to, and ends RESTORED; it is always
committed alone. COMMITTED and RESTORED epochs are snapshots; retention marks the ones it no
longer keeps EXPIRED, together with the epochs merged into them, before vacuum deletes their
files.

Appends are compare-and-swap: an :class:`EpochLog` knows the manifest version it reflects,
and :meth:`~pyspark_abs.commit.EpochWriter.record_all` commits against that version with no
conflict retries, so a writer that lost a race to another (a second vacuum, a second
rollback, a zombie run) reloads the manifest and re-checks its transitions instead of
appending a duplicate. Duplicates written before this rule are ignored on load.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import pyarrow as pa

from pyspark_abs.barrier import FILE_TYPE, FileEntry
from pyspark_abs.errors import ManifestError, SnapshotNotFoundError

log = logging.getLogger("pyspark_abs")

FORMAT_VERSION = 1
"""Version of the manifest's layout, stored in the table description."""


class EpochStatus(str, Enum):
    """Status of an epoch in the manifest (prints as its value, e.g. ``COMMITTED``)."""

    def __str__(self) -> str:
        return self.value

    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"
    ABORTED = "ABORTED"
    RESTORED = "RESTORED"
    MERGED = "MERGED"
    EXPIRED = "EXPIRED"


SNAPSHOT_STATUSES = frozenset({EpochStatus.COMMITTED, EpochStatus.RESTORED})
"""Statuses of epochs whose snapshot can be read and restored."""


class EpochDecision(str, Enum):
    """What the coordinator does with a micro-batch, given the manifest."""

    PROCESS = "process"
    """A new epoch: pre-commit, align, prepare, commit."""
    FINISH_REPLAY = "finish_replay"
    """Spark replays a PREPARED epoch: the decision stands; commit it, discard the replay."""
    SKIP_REPLAY = "skip_replay"
    """Spark replays a committed (or merged, or expired) epoch: discard the replay."""


_ALLOWED: dict[EpochStatus | None, frozenset[EpochStatus]] = {
    None: frozenset({EpochStatus.PREPARED, EpochStatus.ABORTED}),
    EpochStatus.ABORTED: frozenset({EpochStatus.PREPARED, EpochStatus.ABORTED}),
    EpochStatus.PREPARED: frozenset(
        {EpochStatus.COMMITTED, EpochStatus.RESTORED, EpochStatus.MERGED}
    ),
    EpochStatus.COMMITTED: frozenset({EpochStatus.EXPIRED}),
    EpochStatus.RESTORED: frozenset({EpochStatus.EXPIRED}),
    EpochStatus.MERGED: frozenset({EpochStatus.EXPIRED}),
    EpochStatus.EXPIRED: frozenset(),
}

_INT_MAP = pa.map_(pa.string(), pa.int64())
_STR_MAP = pa.map_(pa.string(), pa.string())

_MANIFEST_FIELDS: list[pa.Field[Any]] = [
    pa.field("pipeline", pa.string()),
    pa.field("epoch", pa.int64()),
    pa.field("status", pa.string()),
    pa.field("recorded_at", pa.timestamp("us", tz="UTC")),
    pa.field("run_id", pa.string()),
    pa.field("query_id", pa.string()),
    pa.field("batch_id", pa.int64()),
    pa.field("commit_mode", pa.string()),
    pa.field("num_partitions", pa.int32()),
    pa.field("key_groups", pa.int32()),
    pa.field("tables", _STR_MAP),
    pa.field("files", pa.list_(FILE_TYPE)),
    pa.field("table_versions", _INT_MAP),
    pa.field("rows", _INT_MAP),
    pa.field("bytes", _INT_MAP),
    pa.field("state_keys", pa.int64()),
    pa.field("source_offsets", pa.string()),
    pa.field("watermark_ms", pa.int64()),
    pa.field("batch_ms", pa.float64()),
    pa.field("precommit_ms", pa.float64()),
    pa.field("align_wait_ms", pa.float64()),
    pa.field("align_ms", pa.float64()),
    pa.field("prepare_ms", pa.float64()),
    pa.field("commit_ms", pa.float64()),
    pa.field("pending_epochs", pa.int32()),
    pa.field("error", pa.string()),
    pa.field("checkpoint", pa.string()),
    pa.field("restored_from", pa.int64()),
    pa.field("restore_versions", _INT_MAP),
    pa.field("origin", pa.string()),
    pa.field("snapshot_interval", pa.int32()),
    pa.field("snapshot_epoch", pa.int64()),
]
MANIFEST_SCHEMA = pa.schema(_MANIFEST_FIELDS)
"""Schema of the ``_manifest`` table."""


@dataclass(frozen=True)
class ManifestEntry:
    """One transition of one epoch.

    Attributes:
        pipeline: The pipeline's name.
        epoch: The epoch.
        status: The status the epoch enters.
        recorded_at: When the transition was recorded.
        run_id: The pipeline run (process) that recorded it.
        query_id: Spark's id of the checkpoint that produced the epoch.
        batch_id: Spark's micro-batch id.
        commit_mode: ``sync`` or ``async``.
        num_partitions: Partitions that acknowledged the epoch.
        key_groups: Key groups the operator used.
        tables: Table id to table URI, for every table of the pipeline.
        files: Pre-committed files (PREPARED).
        table_versions: Delta version of each table as of this epoch (COMMITTED).
        rows: Rows pre-committed per table.
        bytes: Bytes pre-committed per table.
        state_keys: Live keys in the operator's state after the epoch.
        source_offsets: The source offsets Spark recorded for the micro-batch.
        watermark_ms: The micro-batch's event-time watermark.
        batch_ms: Wall time of processing plus pre-commit.
        precommit_ms: The slowest task's time writing files.
        align_wait_ms: Time between the first and the last partition's barrier marker.
        align_ms: Time to align markers and verify files.
        prepare_ms: Time to record PREPARED.
        commit_ms: Time to commit all tables.
        pending_epochs: Earlier epochs PREPARED and not committed yet when this one was
            PREPARED: waiting for the background committer (async mode) or for their
            group to close (``snapshot_interval`` > 1).
        error: Why the epoch was aborted (ABORTED).
        checkpoint: The Spark checkpoint location of the run.
        restored_from: Restore epochs: the epoch whose snapshot they install.
        restore_versions: Restore epochs: the Delta version each sink table goes back to.
        origin: Restore epochs: what installed them, for people reading the manifest.
        snapshot_interval: Micro-batch epochs: the run's ``snapshot_interval``, which
            recovery uses to close the groups the run would have closed.
        snapshot_epoch: The snapshot whose commit made the epoch's files visible: the
            epoch itself when COMMITTED or RESTORED, the end of its group when MERGED
            (kept when the epoch is EXPIRED); None before the commit.
    """

    pipeline: str
    epoch: int
    status: EpochStatus
    recorded_at: dt.datetime
    run_id: str
    query_id: str | None = None
    batch_id: int | None = None
    commit_mode: str | None = None
    num_partitions: int | None = None
    key_groups: int | None = None
    tables: Mapping[str, str] = field(default_factory=dict)
    files: tuple[FileEntry, ...] = ()
    table_versions: Mapping[str, int] = field(default_factory=dict)
    rows: Mapping[str, int] = field(default_factory=dict)
    bytes: Mapping[str, int] = field(default_factory=dict)
    state_keys: int | None = None
    source_offsets: str | None = None
    watermark_ms: int | None = None
    batch_ms: float | None = None
    precommit_ms: float | None = None
    align_wait_ms: float | None = None
    align_ms: float | None = None
    prepare_ms: float | None = None
    commit_ms: float | None = None
    pending_epochs: int | None = None
    error: str | None = None
    checkpoint: str | None = None
    restored_from: int | None = None
    restore_versions: Mapping[str, int] = field(default_factory=dict)
    origin: str | None = None
    snapshot_interval: int | None = None
    snapshot_epoch: int | None = None

    @property
    def is_restore(self) -> bool:
        """Whether this is a restore epoch, which installs a snapshot instead of a batch."""
        return self.origin is not None

    def to_row(self) -> dict[str, Any]:
        """The entry as a row of MANIFEST_SCHEMA."""
        row = {name: getattr(self, name) for name in MANIFEST_SCHEMA.names}
        row["status"] = self.status.value
        row["files"] = [f.to_dict() for f in self.files]
        for name in _MAP_FIELDS:
            row[name] = list(row[name].items())
        return row

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ManifestEntry:
        """Build an entry from a row of MANIFEST_SCHEMA (``Table.to_pylist()``)."""
        values = dict(row)
        values["status"] = EpochStatus(values["status"])
        values["files"] = tuple(FileEntry.from_dict(f) for f in values["files"] or ())
        for name in _MAP_FIELDS:
            values[name] = dict(values[name] or ())
        return cls(**values)

    def transition(self, status: EpochStatus, **changes: Any) -> ManifestEntry:
        """A copy of this entry for the next transition, recorded now."""
        return replace(self, status=status, recorded_at=dt.datetime.now(dt.timezone.utc), **changes)


_MAP_FIELDS = ("tables", "table_versions", "rows", "bytes", "restore_versions")


def entries_to_table(entries: Iterable[ManifestEntry]) -> pa.Table:
    """Manifest rows as an Arrow table."""
    return pa.Table.from_pylist([e.to_row() for e in entries], schema=MANIFEST_SCHEMA)


def check_transition(epoch: int, current: EpochStatus | None, new: EpochStatus) -> None:
    """Raise if an epoch may not move from ``current`` to ``new``.

    Raises:
        ManifestError: The transition is not allowed.
    """
    if new not in _ALLOWED[current]:
        shown = current.value if current else "no entry"
        raise ManifestError(
            f"epoch {epoch} cannot go from {shown} to {new.value}; the manifest was changed "
            f"by another writer or is damaged. Run validate on the snapshot root"
        )


class EpochLog:
    """The manifest folded into the current status of every epoch.

    A manifest written before appends were compare-and-swap may hold a transition twice
    (two vacuums both recorded EXPIRED, two rollbacks both PREPARED one restore epoch, a
    zombie recorded a second COMMITTED). Loading keeps the first one recorded and ignores
    the later ones with a warning (:attr:`duplicates`), instead of refusing the root.
    """

    def __init__(self, entries: Iterable[ManifestEntry] = (), version: int | None = None) -> None:
        """Fold entries into the log.

        Args:
            entries: Manifest entries, in any order.
            version: The manifest table's Delta version the entries were read at; appends
                are made against it (None: not read from a manifest, appends unconditional).

        Raises:
            ManifestError: The entries break the epoch state machine (other than by a
                duplicated transition).
        """
        self.version = version
        self._entries: list[ManifestEntry] = []
        self._latest: dict[int, ManifestEntry] = {}
        self._prepared: dict[int, ManifestEntry] = {}
        self._merged: dict[int, list[int]] = {}
        self._seen: set[tuple[int, EpochStatus]] = set()
        self.duplicates: list[ManifestEntry] = []
        """Later copies of a transition already recorded for their epoch, ignored."""
        for entry in sorted(entries, key=_order):
            try:
                self.record(entry)
            except ManifestError:
                if (entry.epoch, entry.status) not in self._seen:
                    raise
                self.duplicates.append(entry)
                log.warning(
                    "manifest: epoch %d has %s recorded more than once; the later copy "
                    "(run %s, %s) is ignored",
                    entry.epoch,
                    entry.status.value,
                    entry.run_id,
                    entry.recorded_at.isoformat(),
                )

    def replace_with(self, other: EpochLog) -> None:
        """Take over another log's entries and version, in place (for holders of this one)."""
        self.version = other.version
        self._entries = list(other._entries)
        self._latest = dict(other._latest)
        self._prepared = dict(other._prepared)
        self._merged = {k: list(v) for k, v in other._merged.items()}
        self._seen = set(other._seen)
        self.duplicates = list(other.duplicates)

    @property
    def entries(self) -> list[ManifestEntry]:
        """All entries, in the order they were recorded."""
        return list(self._entries)

    def check(self, entry: ManifestEntry) -> None:
        """Raise if ``entry`` may not be recorded next.

        Raises:
            ManifestError: The transition is not allowed, a PREPARED epoch is not newer
                than every epoch already decided, or a MERGED epoch names no later snapshot.
        """
        check_transition(entry.epoch, self.status(entry.epoch), entry.status)
        if entry.status is EpochStatus.PREPARED:
            latest = self.latest_decided()
            if latest is not None and entry.epoch <= latest.epoch:
                raise ManifestError(
                    f"epoch {entry.epoch} cannot be PREPARED after epoch {latest.epoch}; "
                    f"epochs are decided in order"
                )
        if entry.status is EpochStatus.MERGED and (
            entry.snapshot_epoch is None or entry.snapshot_epoch <= entry.epoch
        ):
            raise ManifestError(
                f"epoch {entry.epoch} cannot be MERGED into snapshot {entry.snapshot_epoch}; "
                f"an epoch is merged into the snapshot of a later epoch"
            )

    def record(self, entry: ManifestEntry) -> None:
        """Add a transition after checking it is allowed (see :meth:`check`)."""
        self.check(entry)
        if entry.status is EpochStatus.PREPARED:
            self._prepared[entry.epoch] = entry
        if entry.status is EpochStatus.MERGED:
            assert entry.snapshot_epoch is not None
            self._merged.setdefault(entry.snapshot_epoch, []).append(entry.epoch)
        self._entries.append(entry)
        self._latest[entry.epoch] = entry
        self._seen.add((entry.epoch, entry.status))

    def status(self, epoch: int) -> EpochStatus | None:
        """The epoch's current status, or None if it has no entry."""
        entry = self._latest.get(epoch)
        return entry.status if entry else None

    def latest(self, epoch: int) -> ManifestEntry | None:
        """The epoch's latest entry."""
        return self._latest.get(epoch)

    def prepared(self, epoch: int) -> ManifestEntry | None:
        """The epoch's PREPARED entry, which holds its files and offsets."""
        return self._prepared.get(epoch)

    def pending(self) -> list[ManifestEntry]:
        """PREPARED entries of epochs neither committed nor merged yet, oldest first."""
        return [
            self._prepared[e]
            for e in sorted(self._prepared)
            if self._latest[e].status is EpochStatus.PREPARED
        ]

    def snapshots(self) -> list[ManifestEntry]:
        """Latest entries of COMMITTED and RESTORED epochs (readable snapshots), oldest first."""
        return [
            self._latest[e]
            for e in sorted(self._latest)
            if self._latest[e].status in SNAPSHOT_STATUSES
        ]

    def require_snapshot(self, epoch: int, root: str) -> ManifestEntry:
        """The latest entry of ``epoch``, which must be a readable snapshot.

        Raises:
            SnapshotNotFoundError: The epoch is unknown or not COMMITTED or RESTORED; the
                message lists the readable epochs, and for a MERGED epoch names the
                snapshot it was merged into.
        """
        entry = self._latest.get(epoch)
        if entry is not None and entry.status in SNAPSHOT_STATUSES:
            return entry
        readable = epoch_ranges([e.epoch for e in self.snapshots()])
        if entry is not None and entry.status is EpochStatus.MERGED:
            raise SnapshotNotFoundError(
                f"epoch {epoch} of snapshot root {root} is not a snapshot: it was MERGED into "
                f"snapshot {entry.snapshot_epoch} (snapshot_interval "
                f"{entry.snapshot_interval}), whose commit made its outputs visible. Use "
                f"epoch {entry.snapshot_epoch} or another readable epoch: {readable}"
            )
        shown = "not in the manifest" if entry is None else entry.status.value
        raise SnapshotNotFoundError(
            f"epoch {epoch} of snapshot root {root} is {shown}; readable epochs are {readable}"
        )

    def merged_into(self, snapshot: int) -> list[int]:
        """The epochs MERGED into the snapshot of epoch ``snapshot``, oldest first."""
        return sorted(self._merged.get(snapshot, ()))

    def group(self, snapshot: int) -> list[ManifestEntry]:
        """The PREPARED entries whose files the commit of ``snapshot`` made visible.

        Those of the epochs MERGED into the snapshot, then its own, oldest first.
        """
        epochs = [*self.merged_into(snapshot), snapshot]
        return [self._prepared[e] for e in epochs if e in self._prepared]

    def latest_decided(self) -> ManifestEntry | None:
        """The latest entry of the newest epoch that was PREPARED."""
        return self._latest[max(self._prepared)] if self._prepared else None

    def decide(self, epoch: int) -> EpochDecision:
        """What to do with a micro-batch of ``epoch``."""
        status = self.status(epoch)
        if status in (
            EpochStatus.COMMITTED,
            EpochStatus.RESTORED,
            EpochStatus.MERGED,
            EpochStatus.EXPIRED,
        ):
            return EpochDecision.SKIP_REPLAY
        if status is EpochStatus.PREPARED:
            return EpochDecision.FINISH_REPLAY
        latest = self.latest_decided()
        if latest is not None and epoch < latest.epoch:
            raise ManifestError(
                f"Spark runs epoch {epoch}, older than epoch {latest.epoch} already decided, "
                f"but epoch {epoch} has no decision; the manifest and the checkpoint do not "
                f"belong together"
            )
        return EpochDecision.PROCESS


def epoch_ranges(epochs: Iterable[int]) -> str:
    """Epoch numbers as compact ranges, e.g. ``0..4, 7, 9..12`` (``none`` when empty)."""
    parts: list[str] = []
    for epoch in sorted(epochs):
        if parts and parts[-1].split("..")[-1] == str(epoch - 1):
            parts[-1] = f"{parts[-1].split('..')[0]}..{epoch}"
        else:
            parts.append(str(epoch))
    return ", ".join(parts) or "none"


def closes_group(epoch: int, last_snapshot: int | None, interval: int) -> bool:
    """Whether the PREPARED micro-batch ``epoch`` closes a group, so its commit is due.

    Args:
        epoch: The epoch just PREPARED.
        last_snapshot: The newest snapshot or group end before it (None: none yet).
        interval: The snapshot interval in epochs.
    """
    return epoch - (-1 if last_snapshot is None else last_snapshot) >= interval


def recovery_groups(
    pending: Sequence[ManifestEntry], last_snapshot: int | None
) -> list[tuple[ManifestEntry, ...]]:
    """How recovery commits the epochs an earlier run left PREPARED, in order.

    Micro-batch epochs form the groups their run would have closed (each entry records its
    run's snapshot interval; none recorded means 1), and the epochs after the last such
    group end form one more group, which ends at the last of them. A restore epoch is
    always a group of its own.

    Args:
        pending: PREPARED entries not committed yet, oldest first.
        last_snapshot: The newest snapshot epoch (None: none yet).
    """
    groups: list[tuple[ManifestEntry, ...]] = []
    open_group: list[ManifestEntry] = []
    last = last_snapshot
    for entry in pending:
        if entry.is_restore and open_group:
            groups.append(tuple(open_group))
            open_group = []
        open_group.append(entry)
        if entry.is_restore or closes_group(entry.epoch, last, entry.snapshot_interval or 1):
            groups.append(tuple(open_group))
            open_group = []
            last = entry.epoch
    if open_group:
        groups.append(tuple(open_group))
    return groups


def check_group(group: Sequence[ManifestEntry]) -> None:
    """Raise unless ``group`` can be committed as one snapshot.

    A group is one or more PREPARED entries in epoch order with the same tables; a restore
    epoch is always alone.

    Raises:
        ManifestError: The group is empty, out of order, not PREPARED, mixes a restore epoch
            with others, or its epochs write different tables.
    """
    if not group:
        raise ManifestError("a commit needs at least one PREPARED epoch")
    epochs = [e.epoch for e in group]
    end = group[-1]
    problem = None
    if epochs != sorted(set(epochs)):
        problem = "its epochs are not in increasing order"
    elif any(e.status is not EpochStatus.PREPARED for e in group):
        problem = "not every entry is PREPARED"
    elif len(group) > 1 and any(e.is_restore for e in group):
        problem = "a restore epoch is committed alone"
    elif any(dict(e.tables) != dict(end.tables) for e in group):
        problem = "its epochs write different tables"
    if problem is not None:
        raise ManifestError(f"epochs {epochs} cannot be committed as one snapshot: {problem}")


def _order(entry: ManifestEntry) -> tuple[int, int, dt.datetime]:
    """Replay order: by epoch, then by the only valid order of one epoch's transitions."""
    rank = {
        EpochStatus.ABORTED: 0,
        EpochStatus.PREPARED: 1,
        EpochStatus.COMMITTED: 2,
        EpochStatus.RESTORED: 2,
        EpochStatus.MERGED: 2,
        EpochStatus.EXPIRED: 3,
    }
    return (entry.epoch, rank[entry.status], entry.recorded_at)
