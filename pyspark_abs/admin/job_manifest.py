"""The job manifest: which stages a job has, and its job-wide rollbacks.

A Delta table (``_job`` under the job's root) with one row per record:

* ``STAGES``: the job's stages and their snapshot roots, written when a job first starts and
  whenever its stages change, so that the CLI can open a job from its root alone;
* ``ROLLBACK`` ``PREPARED`` then ``COMMITTED``: a job-wide rollback to job snapshot
  ``epoch``, installed in every stage as restore epoch ``restore_epoch``;
* ``RESTORE`` ``PREPARED`` then ``COMMITTED``: job snapshot ``epoch`` of another job root
  (``source``, whose stage roots ``stages`` holds) copied into this job's stages, each as
  restore epoch ``restore_epoch``.

PREPARED is the decision: an installation that crashes after it is finished by the next
start of the job or the next rollback, before anything else runs.

Appends are compare-and-swap against the version read, so two processes never record
conflicting rollbacks. Each row records the version its commit created
(``manifest_version``), and rows are folded in that order: ``recorded_at`` is the writer's
clock, for people reading the table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pyarrow as pa

from pyspark_abs.errors import ManifestError, PipelineMismatchError, SnapshotNotFoundError
from pyspark_abs.protocol.epoch_writer import now
from pyspark_abs.storage.store import DeltaStore, TableSpec, normalize_uri

JOB_TABLE = "_job"
"""Table id, and directory under the job's root, of the job manifest."""

_FIELDS: list[pa.Field[Any]] = [
    pa.field("job", pa.string()),
    pa.field("record", pa.string()),
    pa.field("status", pa.string()),
    pa.field("recorded_at", pa.timestamp("us", tz="UTC")),
    pa.field("stages", pa.map_(pa.string(), pa.string())),
    pa.field("epoch", pa.int64()),
    pa.field("restore_epoch", pa.int64()),
    pa.field("stage_epochs", pa.map_(pa.string(), pa.int64())),
    pa.field("source", pa.string()),
    pa.field("manifest_version", pa.int64()),
]
_SCHEMA = pa.schema(_FIELDS)


class JobRecord(str, Enum):
    """What a row of the job manifest records."""

    STAGES = "STAGES"
    ROLLBACK = "ROLLBACK"
    RESTORE = "RESTORE"


class RollbackStatus(str, Enum):
    """The two phases of a job-wide rollback or restore."""

    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"


@dataclass(frozen=True)
class Rollback:
    """A job-wide rollback, or a restore from another job root.

    Attributes:
        epoch: The job snapshot installed.
        restore_epoch: The restore epoch every stage gets.
        stage_epochs: Each stage's epoch whose snapshot it installs.
        status: PREPARED (decided, maybe not finished) or COMMITTED.
        source: For a restore, the job root copied from; None for a rollback.
        source_stages: For a restore, the stage roots copied from, by stage name.
    """

    epoch: int
    restore_epoch: int
    stage_epochs: Mapping[str, int]
    status: RollbackStatus
    source: str | None = None
    source_stages: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JobManifest:
    """A job manifest as read at one version.

    Attributes:
        uri: Its location.
        job: The job it belongs to.
        version: The Delta version it was read at.
        stages: The stages and their roots, as last recorded.
        rollbacks: The rollbacks, oldest first, each with its latest status.
    """

    uri: str
    job: str
    version: int
    stages: Mapping[str, str] = field(default_factory=dict)
    rollbacks: tuple[Rollback, ...] = ()

    @property
    def root(self) -> str:
        """The job root."""
        return self.uri[: -len(JOB_TABLE) - 1]

    @property
    def unfinished(self) -> Rollback | None:
        """The rollback that was decided but not finished, if any."""
        last = self.rollbacks[-1] if self.rollbacks else None
        return last if last is not None and last.status is RollbackStatus.PREPARED else None


def job_manifest_uri(root: str) -> str:
    """Where the job manifest of a job root lives."""
    return f"{normalize_uri(root)}/{JOB_TABLE}"


def open_job(store: DeltaStore, root: str, job: str | None) -> JobManifest:
    """Read a job's manifest; with ``job`` given, create it if there is none.

    Raises:
        SnapshotNotFoundError: ``job`` is None and ``root`` holds no job.
        PipelineMismatchError: The root belongs to another job.
        ManifestError: The manifest cannot be read.
    """
    uri = job_manifest_uri(root)
    if not store.exists(uri):
        if job is None:
            raise SnapshotNotFoundError(
                f"{normalize_uri(root)} is not a job root (it has no {JOB_TABLE} table); give "
                f"the root a Job was declared with"
            )
        store.ensure_root(normalize_uri(root))
        store.ensure_table(_spec(uri, job))
    else:
        store.add_missing_columns(_spec(uri, job or ""))
    manifest = _read(store, uri)
    if job is not None and manifest.job != job:
        raise PipelineMismatchError(
            f"job root {normalize_uri(root)} belongs to job {manifest.job!r}, not {job!r}; give "
            f"this job its own root"
        )
    return manifest


def _spec(uri: str, job: str) -> TableSpec:
    return TableSpec(JOB_TABLE, uri, _SCHEMA, description=json.dumps({"job": job}))


def _commit_order(row: Mapping[str, Any]) -> tuple[int, int, float]:
    """Rows in the order the table's commits appended them (older rows by their clock)."""
    version = row.get("manifest_version")
    if version is None:
        return (0, 0, row["recorded_at"].timestamp())
    return (1, version, 0.0)


def _read(store: DeltaStore, uri: str) -> JobManifest:
    try:
        rows, version = store.read_versioned(uri)
        owner = json.loads(store.description(uri) or "{}").get("job")
    except Exception as err:
        raise ManifestError(f"cannot read the job manifest at {uri}: {err}") from err
    stages: dict[str, str] = {}
    rollbacks: dict[int, Rollback] = {}
    for row in sorted(rows.to_pylist(), key=_commit_order):
        if row["record"] == JobRecord.STAGES.value:
            stages = dict(row["stages"] or ())
        elif row["record"] in (JobRecord.ROLLBACK.value, JobRecord.RESTORE.value):
            rollbacks[row["restore_epoch"]] = Rollback(
                row["epoch"],
                row["restore_epoch"],
                dict(row["stage_epochs"] or ()),
                RollbackStatus(row["status"]),
                row["source"],
                dict(row["stages"] or ()) if row["source"] else {},
            )
    return JobManifest(
        uri, str(owner), version, stages, tuple(rollbacks[e] for e in sorted(rollbacks))
    )


def record(store: DeltaStore, manifest: JobManifest, **row: Any) -> JobManifest:
    """Append one row against the version ``manifest`` was read at, and read it again.

    Raises:
        ConcurrentWriteError: Another process recorded first; nothing was appended.
    """
    full = {
        "job": manifest.job,
        "recorded_at": now(),
        "manifest_version": manifest.version + 1,
        "stages": None,
        "epoch": None,
        "restore_epoch": None,
        "stage_epochs": None,
        "source": None,
        **row,
    }
    for name in ("stages", "stage_epochs"):
        if full[name] is not None:
            full[name] = list(full[name].items())
    store.append(manifest.uri, pa.Table.from_pylist([full], schema=_SCHEMA), manifest.version)
    return _read(store, manifest.uri)


def record_installation(
    store: DeltaStore, manifest: JobManifest, installed: Rollback
) -> JobManifest:
    """Append a rollback's or restore's row with its status (see :func:`record`)."""
    return record(
        store,
        manifest,
        record=(JobRecord.ROLLBACK if installed.source is None else JobRecord.RESTORE).value,
        status=installed.status.value,
        epoch=installed.epoch,
        restore_epoch=installed.restore_epoch,
        stage_epochs=dict(installed.stage_epochs),
        source=installed.source,
        stages=dict(installed.source_stages) if installed.source else None,
    )
