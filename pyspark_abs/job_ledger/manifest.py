"""The job manifest: which stages a job has, and its job-wide decisions.

A Delta table (``_job`` under the job's root) with one row per record:

* ``STAGES``: the job's stages and their snapshot roots, written when a job first starts and
  whenever its stages change, so that the CLI can open a job from its root alone;
* a job-wide decision, ``PREPARED`` then ``COMMITTED``: job snapshot ``epoch`` installed in
  every stage as restore epoch ``restore_epoch``, so that the stages keep one epoch
  numbering and their channels stay aligned. Its kind says why:

  * ``ROLLBACK``: a rollback to job snapshot ``epoch``;
  * ``RESTORE``: job snapshot ``epoch`` of another job root (``source``, whose stage roots
    ``stages`` holds) copied into this job's stages;
  * ``MIGRATE``: some stages' state migrated to a new state schema (``states``: the
    migrated state of each, written before the decision);
  * ``WRITE_STATE``: a stage's state replaced by written state (``states``).

PREPARED is the decision: an installation that crashes after it is finished by the next
start of the job or of any of its stages (each installs its own part first), or by the next
job-wide operation, before anything else runs. A decision that a stage can no longer take
(it ran epochs of its own meanwhile, which only an older pyspark-abs allowed) is
``ABANDONED`` and decided again with a later restore epoch.

Appends are compare-and-swap against the version read, so two processes never record
conflicting decisions. Each row records the version its commit created
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
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore, TableSpec

JOB_TABLE = "_job"
"""Table id, and directory under the job's root, of the job manifest."""

_STR_MAP = pa.map_(pa.string(), pa.string())
_FIELDS: list[pa.Field[Any]] = [
    pa.field("job", pa.string()),
    pa.field("record", pa.string()),
    pa.field("status", pa.string()),
    pa.field("recorded_at", pa.timestamp("us", tz="UTC")),
    pa.field("stages", _STR_MAP),
    pa.field("epoch", pa.int64()),
    pa.field("restore_epoch", pa.int64()),
    pa.field("stage_epochs", pa.map_(pa.string(), pa.int64())),
    pa.field("source", pa.string()),
    pa.field("manifest_version", pa.int64()),
    pa.field("states", _STR_MAP),
]
_SCHEMA = pa.schema(_FIELDS)


class JobRecord(str, Enum):
    """What a row of the job manifest records."""

    STAGES = "STAGES"
    ROLLBACK = "ROLLBACK"
    RESTORE = "RESTORE"
    MIGRATE = "MIGRATE"
    WRITE_STATE = "WRITE_STATE"


class DecisionStatus(str, Enum):
    """The phases of a job-wide decision."""

    PREPARED = "PREPARED"
    COMMITTED = "COMMITTED"
    ABANDONED = "ABANDONED"


@dataclass(frozen=True)
class JobDecision:
    """A job-wide decision: job snapshot ``epoch`` installed in every stage.

    Attributes:
        kind: ROLLBACK, RESTORE, MIGRATE or WRITE_STATE.
        epoch: The job snapshot installed.
        restore_epoch: The restore epoch every stage gets.
        stage_epochs: Each stage's epoch whose snapshot it installs.
        status: PREPARED (decided, maybe not finished), COMMITTED or ABANDONED.
        source: For a restore, the job root copied from; None otherwise.
        source_stages: For a restore, the stage roots copied from, by stage name.
        states: The stages whose state the decision replaces, each with the state to
            install (see :class:`~pyspark_abs.install.installing.StateInstall`), as JSON.
    """

    kind: JobRecord
    epoch: int
    restore_epoch: int
    stage_epochs: Mapping[str, int]
    status: DecisionStatus
    source: str | None = None
    source_stages: Mapping[str, SnapshotRoot] = field(default_factory=dict)
    states: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class JobManifest:
    """A job manifest as read at one version.

    Attributes:
        uri: Its location.
        job: The job it belongs to.
        version: The Delta version it was read at.
        stages: The stages and their roots, as last recorded.
        decisions: The decisions, oldest first, each with its latest status.
    """

    uri: str
    job: str
    version: int
    stages: Mapping[str, SnapshotRoot] = field(default_factory=dict)
    decisions: tuple[JobDecision, ...] = ()

    @property
    def root(self) -> SnapshotRoot:
        """The job root."""
        return SnapshotRoot(self.uri[: -len(JOB_TABLE) - 1])

    @property
    def unfinished(self) -> JobDecision | None:
        """The decision that was made but not finished, if any."""
        last = self.decisions[-1] if self.decisions else None
        return last if last is not None and last.status is DecisionStatus.PREPARED else None

    def stage_of(self, root: SnapshotRoot) -> str | None:
        """The name of the stage whose snapshot root is ``root``, if it is one of the job's."""
        return next((n for n, r in self.stages.items() if r == root), None)


def job_manifest_uri(root: SnapshotRoot) -> str:
    """Where the job manifest of a job root lives."""
    return root.table_uri(JOB_TABLE)


def open_job(store: DeltaStore, root: SnapshotRoot, job: str | None) -> JobManifest:
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
                f"{root} is not a job root (it has no {JOB_TABLE} table); give "
                f"the root a Job was declared with"
            )
        store.ensure_root(root)
        store.ensure_table(_spec(uri, job))
    else:
        store.add_missing_columns(_spec(uri, job or ""))
    manifest = _read(store, uri)
    if job is not None and manifest.job != job:
        raise PipelineMismatchError(
            f"job root {root} belongs to job {manifest.job!r}, not {job!r}; give "
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
    stages: dict[str, SnapshotRoot] = {}
    decisions: dict[int, JobDecision] = {}
    for row in sorted(rows.to_pylist(), key=_commit_order):
        if row["record"] == JobRecord.STAGES.value:
            stages = _roots(row["stages"])
            continue
        decisions[row["restore_epoch"]] = JobDecision(
            JobRecord(row["record"]),
            row["epoch"],
            row["restore_epoch"],
            dict(row["stage_epochs"] or ()),
            DecisionStatus(row["status"]),
            row["source"],
            _roots(row["stages"]) if row["source"] else {},
            dict(row.get("states") or ()),
        )
    return JobManifest(
        uri, str(owner), version, stages, tuple(decisions[e] for e in sorted(decisions))
    )


def _roots(stages: Any) -> dict[str, SnapshotRoot]:
    """A ``stages`` column's value: stage names and their snapshot roots."""
    return {name: SnapshotRoot(root) for name, root in dict(stages or ()).items()}


def record(store: DeltaStore, manifest: JobManifest, **row: Any) -> JobManifest:
    """Append one row against the version ``manifest`` was read at, and read it again.

    Raises:
        ConcurrentWriteError: Another process recorded first; nothing was appended.
    """
    return _append(store, manifest, [row])


def record_decisions(
    store: DeltaStore, manifest: JobManifest, *decisions: JobDecision
) -> JobManifest:
    """Append the decisions' rows, each with its status, in one commit (see :func:`record`).

    An unfinished decision ABANDONED and the decision that replaces it land together or not
    at all.
    """
    rows = [
        {
            "record": d.kind.value,
            "status": d.status.value,
            "epoch": d.epoch,
            "restore_epoch": d.restore_epoch,
            "stage_epochs": dict(d.stage_epochs),
            "source": d.source,
            "stages": dict(d.source_stages) if d.source else None,
            "states": dict(d.states) or None,
        }
        for d in decisions
    ]
    return _append(store, manifest, rows)


def _append(store: DeltaStore, manifest: JobManifest, rows: list[dict[str, Any]]) -> JobManifest:
    defaults = {
        "job": manifest.job,
        "recorded_at": now(),
        "manifest_version": manifest.version + 1,
        "stages": None,
        "epoch": None,
        "restore_epoch": None,
        "stage_epochs": None,
        "source": None,
        "states": None,
    }
    full = [{**defaults, **row} for row in rows]
    for row in full:
        for name in ("stages", "stage_epochs", "states"):
            if row[name] is not None:
                row[name] = list(row[name].items())
    store.append(manifest.uri, pa.Table.from_pylist(full, schema=_SCHEMA), manifest.version)
    return _read(store, manifest.uri)
