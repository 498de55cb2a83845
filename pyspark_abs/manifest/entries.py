"""The manifest: the durable log of epoch transitions, and its state machine.

The manifest is a Delta table (``_manifest`` under the snapshot root) with one row per
transition of an epoch. Appending PREPARED is the decision point of the two-phase commit:
from then on the epoch will be committed, at the latest by recovery. COMMITTED records the
Delta version of every table, which together form the consistent cut of the epoch.

Allowed transitions of one epoch::

    (none) ──► PREPARED ──► COMMITTED ──► EXPIRED
       │          ▲  │  ├─► RESTORED ──┤
       └► ABORTED ┘◄─┘  └─► MERGED ────┘
                      (an aborted epoch is replayed by Spark and may be prepared again)

A PREPARED epoch goes to ABORTED only when it can never be committed (files it needs are
gone) and a rollback replaces it, in the same append as the rollback's restore epoch (see
:mod:`pyspark_abs.install.stuck_epochs`).

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

A snapshot can be given names (named savepoints): a TAGGED row gives one, an UNTAGGED row
takes it away. These rows do not move the epoch; a name names one snapshot at a time, and a
named snapshot cannot be EXPIRED.

Appends are compare-and-swap: an :class:`EpochLog` knows the manifest version it reflects,
and :meth:`~pyspark_abs.protocol.epoch_writer.EpochWriter.record_all` commits against that
version with no conflict retries, so a writer that lost a race to another (a second vacuum, a second
rollback, a zombie run) reloads the manifest and re-checks its transitions instead of
appending a duplicate. Duplicates written before this rule are ignored on load.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any

import pyarrow as pa

from pyspark_abs.errors import ManifestError
from pyspark_abs.storage.files import FILE_TYPE, FileEntry

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
    TAGGED = "TAGGED"
    """A row naming a snapshot (a named savepoint); the epoch's status does not change."""
    UNTAGGED = "UNTAGGED"
    """A row taking a snapshot's name away; the epoch's status does not change."""


TAG_STATUSES = frozenset({EpochStatus.TAGGED, EpochStatus.UNTAGGED})
"""Statuses of the rows that name snapshots rather than move an epoch."""

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
        {EpochStatus.COMMITTED, EpochStatus.RESTORED, EpochStatus.MERGED, EpochStatus.ABORTED}
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
    pa.field("tag", pa.string()),
    pa.field("table_schemas", _STR_MAP),
    pa.field("manifest_version", pa.int64()),
    pa.field("job", pa.string()),
    pa.field("watermark_after_ms", pa.int64()),
    pa.field("slots", pa.int32()),
]
MANIFEST_SCHEMA = pa.schema(_MANIFEST_FIELDS)
"""Schema of the ``_manifest`` table."""


@dataclass(frozen=True, kw_only=True)
class EpochRecord:
    """What the manifest says of one epoch that a reader of snapshots sees.

    The fields :class:`ManifestEntry` (a row of the manifest) and
    :class:`~pyspark_abs.manifest.info.SnapshotInfo` (an epoch as users read it) share,
    defined once here.

    Attributes:
        epoch: The epoch.
        status: The status the epoch enters (an entry) or its latest status (a snapshot's
            info): COMMITTED or RESTORED (a snapshot), MERGED (committed as part of a later
            snapshot), PREPARED, ABORTED or EXPIRED; TAGGED and UNTAGGED rows name snapshots.
        recorded_at: When the epoch reached its status, by the writer's clock.
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
        error: Why the epoch was aborted (ABORTED).
        restored_from: Restore epochs: the epoch whose snapshot they install.
        origin: Restore epochs: what installed them (rollback, restore, write_state, a job's
            decision), for people reading the manifest.
        snapshot_epoch: The snapshot whose commit made the epoch's outputs visible: the
            epoch itself for a snapshot, the end of its group for a MERGED epoch (kept when
            the epoch is EXPIRED); None before the commit.
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


@dataclass(frozen=True, kw_only=True)
class RunPayload:
    """What an epoch of a run records about the run that processed it.

    Attributes:
        checkpoint: The Spark checkpoint location of the run.
        commit_mode: ``sync`` or ``async``.
        slots: The slots the run's checkpoint groups key groups into, one call of the
            operator per slot and epoch (None: one call per key group).
        snapshot_interval: The run's ``snapshot_interval``, which recovery uses to close
            the groups the run would have closed.
    """

    checkpoint: str | None = None
    commit_mode: str | None = None
    slots: int | None = None
    snapshot_interval: int | None = None


@dataclass(frozen=True, kw_only=True)
class RestorePayload:
    """What a restore epoch records about the snapshot it installs.

    Attributes:
        versions: The Delta version each sink table goes back to.
        schemas: The Delta schema (JSON) each state table and back-edge log takes with
            the installed files; a migration or a rollback across one changes it.
        watermark_after_ms: The watermark the epoch after the installed one ran with, when
            its root knew it. Spark moves the watermark after every micro-batch, so a run
            continued from the restore epoch starts there.
        job: For a job-wide decision (a job rollback, restore, migration or written
            state): the job's root. The stages reading this stage's channels tell such a
            restore epoch from a rollback of this stage alone.
    """

    versions: Mapping[str, int] = field(default_factory=dict)
    schemas: Mapping[str, str] = field(default_factory=dict)
    watermark_after_ms: int | None = None
    job: str | None = None


@dataclass(frozen=True, kw_only=True)
class ManifestEntry(EpochRecord):
    """One transition of one epoch: a row of the manifest.

    The fields of :class:`EpochRecord`, the fields below, which every row has, and the
    payload of what wrote it: ``run`` for an epoch of a run (PREPARED, then COMMITTED or
    MERGED, ABORTED, EXPIRED), ``restore`` for a restore epoch (PREPARED, then RESTORED).
    Of the header, an epoch of a run fills ``query_id``, ``batch_id``, the figures and
    timings, ``source_offsets`` and ``watermark_ms``; a restore epoch ``restored_from`` and
    ``origin``; COMMITTED, RESTORED and MERGED rows ``table_versions`` (snapshots) and
    ``snapshot_epoch``; ABORTED rows ``error``; TAGGED and UNTAGGED rows ``tag``. A
    transition copies the payload of the row before it.

    Attributes:
        pipeline: The pipeline's name.
        run_id: The pipeline run (process) that recorded it.
        num_partitions: Partitions that acknowledged the epoch (a restore epoch: those
            of the epoch it installs).
        key_groups: Key groups the operator's state is split into.
        tables: Table id to table URI, for every table of the pipeline.
        files: Pre-committed files (PREPARED).
        tag: TAGGED and UNTAGGED rows: the savepoint name given to or taken from the
            epoch's snapshot.
        manifest_version: The manifest's Delta version whose commit appended the row: the
            order in which rows were recorded (None: written by an older pyspark-abs).
            ``recorded_at`` comes from the writer's clock, which may be behind another
            writer's, so it is for display only.
        run: An epoch of a run: what the run was.
        restore: A restore epoch: what it installs; set exactly when ``origin`` is (empty
            when only ``origin`` is given).
    """

    pipeline: str
    run_id: str
    num_partitions: int | None = None
    key_groups: int | None = None
    tables: Mapping[str, str] = field(default_factory=dict)
    files: tuple[FileEntry, ...] = ()
    tag: str | None = None
    manifest_version: int | None = None
    run: RunPayload | None = None
    restore: RestorePayload | None = None

    def __post_init__(self) -> None:
        if self.origin is None and self.restore is not None:
            raise ValueError(f"epoch {self.epoch}: a restore payload needs the origin of it")
        if self.origin is not None and self.restore is None:
            object.__setattr__(self, "restore", RestorePayload())

    @property
    def watermark_floor_ms(self) -> int:
        """The watermark the epochs after this one never fall below.

        That is its own, or for a restore epoch the one the epoch after the installed one
        ran with.
        """
        after = self.restore.watermark_after_ms if self.restore is not None else None
        return max(self.watermark_ms or 0, after or 0)

    @property
    def is_restore(self) -> bool:
        """Whether this is a restore epoch, which installs a snapshot instead of a batch."""
        return self.restore is not None

    def to_row(self) -> dict[str, Any]:
        """The entry as a row of MANIFEST_SCHEMA."""
        run, restore = self.run or RunPayload(), self.restore or RestorePayload()
        row = {
            **{name: getattr(self, name) for name in _HEADER_FIELDS},
            **{name: getattr(run, name) for name in _RUN_FIELDS},
            **{column: getattr(restore, name) for column, name in _RESTORE_COLUMNS.items()},
        }
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
        run = {name: values.pop(name, None) for name in _RUN_FIELDS}
        restore = {name: values.pop(column, None) for column, name in _RESTORE_COLUMNS.items()}
        if values.get("origin") is not None:
            values["restore"] = RestorePayload(**restore)
        elif any(v is not None for v in run.values()):
            values["run"] = RunPayload(**run)
        return cls(**values)

    def transition(self, status: EpochStatus, **changes: Any) -> ManifestEntry:
        """A copy of this entry for the next transition, recorded now."""
        fresh: dict[str, Any] = {"manifest_version": None, **changes}
        return replace(self, status=status, recorded_at=dt.datetime.now(dt.timezone.utc), **fresh)


_MAP_FIELDS = ("tables", "table_versions", "rows", "bytes", "restore_versions", "table_schemas")
_RUN_FIELDS = tuple(f.name for f in fields(RunPayload))
_RESTORE_COLUMNS = {
    "restore_versions": "versions",
    "table_schemas": "schemas",
    "watermark_after_ms": "watermark_after_ms",
    "job": "job",
}
"""Manifest columns of the restore payload, and its fields."""
_HEADER_FIELDS = tuple(
    name for name in MANIFEST_SCHEMA.names if name not in (*_RUN_FIELDS, *_RESTORE_COLUMNS)
)


def commit_order(entry: ManifestEntry) -> tuple[int, int, float]:
    """A sort key that puts rows in the order the manifest recorded them.

    Rows of one commit share a key, so a stable sort keeps their order within the commit.
    Rows written by an older pyspark-abs (no ``manifest_version``) come first, by their
    writers' clocks, which is all they have.
    """
    if entry.manifest_version is None:
        return (0, 0, entry.recorded_at.timestamp())
    return (1, entry.manifest_version, 0.0)


def entries_of(rows: pa.Table | pa.RecordBatch) -> list[ManifestEntry]:
    """Manifest rows as entries.

    ``recorded_at`` is converted here rather than by pyarrow, whose conversion of timestamps
    loads pandas: a Python data source process reading manifests need not.
    """
    if "recorded_at" not in rows.schema.names:
        return [ManifestEntry.from_row(r) for r in rows.to_pylist()]
    column = rows.column("recorded_at")
    micros = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
    others = rows.drop_columns(["recorded_at"]).to_pylist()
    return [
        ManifestEntry.from_row(
            {**r, "recorded_at": None if m is None else _UNIX_EPOCH + dt.timedelta(microseconds=m)}
        )
        for r, m in zip(others, micros, strict=True)
    ]


_UNIX_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


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
