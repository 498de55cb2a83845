"""Retention and vacuum: keeping the last N snapshots, and deleting what none of them needs.

**Retention** keeps the last N snapshots: older ones, with the epochs MERGED into them, are
marked EXPIRED in the manifest first, so nobody reads or restores them while **vacuum**
deletes the files that no retained snapshot's table version references and it can prove
dead (see :func:`vacuum`), and the Delta log of state tables and back-edge logs below the
oldest retained snapshot (the tables keep their log until then: ``KEEP_LOG``). Compactions
commit only on the table version they checked, so two compactions, or a compaction and a
rollback, never change the state of an epoch.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import ConfigError, ManifestError
from pyspark_abs.faults import FaultInjector, FaultStep
from pyspark_abs.manifest.entries import EpochStatus
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import (
    open_root,
    root_owner,
    tables_of,
)
from pyspark_abs.protocol.compaction import Progress, quiet
from pyspark_abs.protocol.epoch_writer import MANIFEST_RETRIES, EpochWriter
from pyspark_abs.storage.files import (
    add_actions,
    data_files,
    delete_files,
    files_at,
    removed_paths,
)
from pyspark_abs.storage.log_files import remove_log_below
from pyspark_abs.storage.root import (
    BACKEDGE_PREFIX,
    STATE_PREFIX,
    SnapshotRoot,
    file_name,
)
from pyspark_abs.storage.store import DeltaStore


@dataclass(frozen=True)
class VacuumReport:
    """What :func:`vacuum` did.

    Attributes:
        expired: Epochs marked EXPIRED by this call (with ``dry_run``: that would be).
        deleted: Deleted files, by table id.
        kept_in_flight: Unreferenced files kept because vacuum cannot prove them dead.
        dry_run: Whether files were only listed.
        log_removed: Delta log entries deleted below the oldest retained snapshot's
            version, by table id (state tables and back-edge logs only).
    """

    expired: list[int] = field(default_factory=list)
    deleted: dict[str, list[str]] = field(default_factory=dict)
    kept_in_flight: int = 0
    dry_run: bool = False
    log_removed: dict[str, list[str]] = field(default_factory=dict)


def expire(root: str, keep_last: int, *, dry_run: bool = False) -> list[int]:
    """Mark all but the newest ``keep_last`` snapshots EXPIRED; return the epochs marked.

    The epochs MERGED into an expired snapshot expire with it, in the same manifest commit.
    Named savepoints (:func:`~pyspark_abs.tag`) never expire; they are kept on top of the
    newest ``keep_last``. A snapshot named by another process while this runs is kept: what
    to expire is worked out again from the manifest that process wrote.
    With ``dry_run``, return the epochs that would be marked and change nothing.

    Raises:
        ConfigError: ``keep_last`` is below 1.
        SnapshotNotFoundError: The root does not exist.
        ManifestError: Other writers kept changing what may expire (run it again).
    """
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ConfigError(f"keep_last must be an integer of at least 1, got {keep_last!r}")
    root = SnapshotRoot(root)
    store = DeltaStore()
    attempts = MANIFEST_RETRIES
    while True:
        epochs = open_root(store, root)
        doomed = _doomed(epochs, keep_last)
        if dry_run or not doomed:
            return doomed
        owner = root_owner(store, root)
        writer = EpochWriter(owner, root, store, epochs, f"vacuum-{uuid.uuid4().hex}")
        transitions = [
            entry.transition(EpochStatus.EXPIRED, run_id=writer.run_id, files=())
            for entry in (epochs.latest(e) for e in doomed)
            if entry is not None
        ]
        try:
            writer.record_all(transitions)
            return doomed
        except ManifestError:
            attempts -= 1
            if not attempts or _doomed(open_root(store, root), keep_last) == doomed:
                raise  # not a race that changed what may expire


def _doomed(epochs: EpochLog, keep_last: int) -> list[int]:
    """The epochs retention marks EXPIRED.

    Those are the snapshots before the newest ``keep_last`` that have no name, each with
    the epochs MERGED into it.
    """
    snapshots = epochs.snapshots()
    return [
        epoch
        for snapshot in snapshots[: max(0, len(snapshots) - keep_last)]
        if not epochs.tags_of(snapshot.epoch)
        for epoch in [*epochs.merged_into(snapshot.epoch), snapshot.epoch]
        if epochs.status(epoch) is not EpochStatus.EXPIRED
    ]


def vacuum(
    root: str,
    *,
    keep_last: int | None = None,
    min_age_seconds: float = 3600.0,
    removed_file_retention_seconds: float | None = None,
    dry_run: bool = False,
    progress: Progress = quiet,
    config: AbsConfig | None = None,
) -> VacuumReport:
    """Delete files that no retained snapshot references, after applying retention.

    Only files vacuum can prove dead are deleted (see :func:`_dead`): files pyspark-abs
    wrote for this root, for an epoch already decided (so never again committed), that
    neither a retained snapshot's table version nor the latest one references, and
    compaction outputs that were committed and replaced since. Files of epochs newer than
    every decided one, files PREPARED epochs list, files of compactions that have not
    committed yet, files with names pyspark-abs does not write and, in sink tables, files
    other pipelines wrote are kept. After listing, the manifest and the tables are read
    again, and files referenced or listed meanwhile are kept too.

    Args:
        root: The snapshot root.
        keep_last: First expire all but the newest ``keep_last`` snapshots.
        min_age_seconds: Keep a replaced compaction output younger than this, and one
            that was never committed younger than this or a day, whichever is longer (a
            compaction that has not committed within a day crashed). Files written for an
            epoch are deleted by what the manifest says of the epoch, not by age.
        removed_file_retention_seconds: Keep a file of a sink that a commit removed (a
            rollback, a restore, a compaction, a user's ``OPTIMIZE``) this long after its
            removal, as Delta's own ``VACUUM`` does, so that a reader lagging behind (a
            ``readStream`` on the sink) can still read the versions that added it. None:
            the sink's ``delta.deletedFileRetentionDuration``, or Delta's default of 7
            days. State tables and back-edge logs, which only the root reads, follow
            ``min_age_seconds``.
        dry_run: List what would expire and be deleted, and change nothing.
        progress: Receives a line per table.
        config: Only its injected faults matter.

    Raises:
        SnapshotNotFoundError: The root does not exist.
        ConfigError: ``removed_file_retention_seconds`` is negative (nothing is changed).
    """
    if removed_file_retention_seconds is not None and not removed_file_retention_seconds >= 0:
        raise ConfigError(
            f"vacuum of {root}: removed_file_retention_seconds must be 0 or more seconds, got "
            f"{removed_file_retention_seconds!r}; None keeps each sink's own "
            f"delta.deletedFileRetentionDuration"
        )
    faults = FaultInjector((config or AbsConfig()).faults)
    expired = expire(root, keep_last, dry_run=dry_run) if keep_last is not None else []
    root = SnapshotRoot(root)
    store = DeltaStore()
    epochs = open_root(store, root)
    expiring = set(expired)
    retained = [s for s in epochs.snapshots() if s.epoch not in expiring]
    decided = epochs.latest_decided()
    newest_decided = decided.epoch if decided is not None else -1
    tag = root.tag
    deleted: dict[str, list[str]] = {}
    log_removed: dict[str, list[str]] = {}
    kept = 0
    for table, uri in tables_of(epochs.entries).items():
        if not store.exists(uri):
            continue
        progress(f"vacuuming {table}")
        versions = {e.table_versions[table] for e in retained if table in e.table_versions}
        referenced = _referenced(store, uri, versions)
        in_flight = {f.path for e in epochs.pending() for f in e.files if f.table == table}
        replaced = removed_paths(uri)
        doomed = []
        sink = not table.startswith((STATE_PREFIX, BACKEDGE_PREFIX))
        kept_removed = None
        if sink:
            kept_removed = removed_file_retention_seconds
            if kept_removed is None:
                kept_removed = deleted_file_retention_seconds(store.properties(uri))
        rule = _DeadFile(table, tag, newest_decided, min_age_seconds, kept_removed, time.time())
        for path, age in data_files(uri):
            if path in referenced:
                continue
            if path not in in_flight and rule.dead(path, age, path in replaced, replaced.get(path)):
                doomed.append(path)
            else:
                kept += 1
        doomed, late = _still_dead(store, root, table, uri, versions, doomed, expiring)
        kept += late
        if doomed and not dry_run:
            delete_files(uri, doomed)
            faults.at(FaultStep.DURING_VACUUM, newest_decided)
        if doomed:
            deleted[table] = sorted(doomed)
        if versions and table.startswith((STATE_PREFIX, BACKEDGE_PREFIX)) and not dry_run:
            # Only tables this root alone writes: a sink's other writers keep their own
            # snapshots of it. The log below the oldest retained version is no snapshot's.
            removed = remove_log_below(uri, min(versions))
            if removed:
                log_removed[table] = removed
    return VacuumReport(expired, deleted, kept, dry_run, log_removed)


_ABANDONED_AFTER_SECONDS = 86_400.0
"""A compaction output never committed this long after it was written was left by a crash."""


@dataclass(frozen=True)
class _DeadFile:
    """Which unreferenced, unlisted files of one table vacuum may delete."""

    table: str
    tag: str
    newest_decided: int
    min_age_seconds: float
    removed_retention_seconds: float | None
    """How long a sink keeps a file after a commit removed it; None: not a sink."""
    now: float

    def dead(self, path: str, age: float, replaced: bool, removed_at_ms: int | None) -> bool:
        """Whether a file no retained version references and no PREPARED epoch lists is dead.

        Args:
            path: The file's path under the table root.
            age: Seconds since it was last modified.
            replaced: Whether the table's log removes it (it was committed, then replaced).
            removed_at_ms: When the newest remove of it was committed (None: unknown).
        """
        name = file_name(path)
        if name is None:
            return False  # not written by pyspark-abs
        if not self.table.startswith((STATE_PREFIX, BACKEDGE_PREFIX)) and name.tag != self.tag:
            return False  # a sink another pipeline (or an older pyspark-abs) writes too
        if replaced and self.removed_retention_seconds is not None:
            # a reader of the sink that lags behind still reads the versions that added it
            if removed_at_ms is None:
                return False
            if self.now - removed_at_ms / 1000 < self.removed_retention_seconds:
                return False
        if name.compaction:
            old_enough = age >= max(self.min_age_seconds, _ABANDONED_AFTER_SECONDS)
            return (replaced and age >= self.min_age_seconds) or old_enough
        return name.epoch <= self.newest_decided


DELTA_DELETED_FILE_RETENTION_SECONDS = 7 * 86_400.0
"""Delta's default ``delta.deletedFileRetentionDuration``: one week."""
_INTERVAL_UNITS = {
    "millisecond": 0.001,
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86_400.0,
    "week": 604_800.0,
}


def deleted_file_retention_seconds(properties: Mapping[str, str]) -> float:
    """A table's ``delta.deletedFileRetentionDuration`` in seconds (Delta's default: 7 days).

    The value is Delta's interval, such as ``interval 7 days`` or ``interval 1 hour``; one
    that cannot be read counts as the default, the longer wait that loses nothing.
    """
    text = properties.get("delta.deletedFileRetentionDuration")
    if text is None:
        return DELTA_DELETED_FILE_RETENTION_SECONDS
    parts = text.strip().lower().split()
    if parts and parts[0] == "interval":
        parts = parts[1:]
    if len(parts) % 2 or not parts:
        return DELTA_DELETED_FILE_RETENTION_SECONDS
    total = 0.0
    for amount, unit in zip(parts[::2], parts[1::2], strict=True):
        scale = _INTERVAL_UNITS.get(unit.removesuffix("s"))
        try:
            value = float(amount)
        except ValueError:
            return DELTA_DELETED_FILE_RETENTION_SECONDS
        if scale is None or value < 0:
            return DELTA_DELETED_FILE_RETENTION_SECONDS
        total += value * scale
    return total


def _referenced(store: DeltaStore, uri: str, versions: Iterable[int]) -> set[str]:
    """Files the given versions of a table and its latest version reference."""
    current = store.open(uri)
    paths = {unquote(a["path"]) for a in add_actions(current)}
    for version in set(versions) - {int(current.version())}:
        paths |= {unquote(a["path"]) for a in files_at(uri, version)}
    return paths


def _still_dead(
    store: DeltaStore,
    root: SnapshotRoot,
    table: str,
    uri: str,
    versions: set[int],
    doomed: list[str],
    expiring: set[int],
) -> tuple[list[str], int]:
    """The doomed files still dead after reading the manifest and the table again.

    An epoch may have been prepared or committed, or a snapshot retained, while the table
    was listed (a file of an epoch decided meanwhile is referenced or was dead before).
    Returns the files still dead and how many are now kept.
    """
    if not doomed:
        return doomed, 0
    epochs = open_root(store, root)
    versions = versions | {
        e.table_versions[table]
        for e in epochs.snapshots()
        if table in e.table_versions and e.epoch not in expiring
    }
    live = _referenced(store, uri, versions)
    live |= {f.path for e in epochs.pending() for f in e.files if f.table == table}
    still = [path for path in doomed if path not in live]
    return still, len(doomed) - len(still)
