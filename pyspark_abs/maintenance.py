"""Keeping a snapshot root small and sound: compaction, retention, vacuum and validation.

The state table grows by the changed keys of every epoch (seed 003's incremental
checkpoints). **Compaction** rewrites the latest row per key as of a snapshot in one Delta
commit that removes the files it replaces (``dataChange=false``); epochs committed
meanwhile append other files, so it runs beside a running pipeline and retries when Delta
reports a conflict. Older epochs stay readable: they are read at their own table version.
A back-edge log grows by every record sent around the loop; compaction removes the files
whose records the snapshot had consumed, the same way.

**Retention** keeps the last N snapshots: older ones, with the epochs MERGED into them, are
marked EXPIRED in the manifest first, so nobody reads or restores them while **vacuum**
deletes the files that no retained snapshot's table version references and it can prove
dead (see :func:`vacuum`), and the Delta log of state tables and back-edge logs below the
oldest retained snapshot (the tables keep their log until then: ``KEEP_LOG``). Compactions
commit only on the table version they checked, so two compactions, or a compaction and a
rollback, never change the state of an epoch.

**Validation** checks every retained snapshot: table versions exist, their files exist with
the recorded sizes, they hold the files of every epoch of the snapshot's group, commits
carry the epoch's application transaction, and no key has two changes in one epoch.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from pyspark_abs.backedge import BACKEDGE_PREFIX, consumed_before
from pyspark_abs.changelog import duplicate_changes, latest_per_key
from pyspark_abs.commit import EpochWriter
from pyspark_abs.config import AbsConfig
from pyspark_abs.envelope import Kind
from pyspark_abs.errors import (
    AbsError,
    CommitError,
    ConfigError,
    FencingError,
    SnapshotDamagedError,
    SnapshotNotFoundError,
)
from pyspark_abs.faults import FaultInjector, FaultStep
from pyspark_abs.manifest import EpochLog, EpochStatus, ManifestEntry
from pyspark_abs.precommit import (
    TableTarget,
    compaction_prefix,
    file_name,
    root_tag,
    write_files,
)
from pyspark_abs.recovery import manifest_owner, manifest_root_id, open_manifest
from pyspark_abs.schema import EPOCH
from pyspark_abs.store import (
    APP_ID_KEY,
    EPOCH_KEY,
    DeltaStore,
    app_id,
    arrow_schema,
    brief_error,
    log_entries,
    normalize_uri,
    remove_log_below,
)

log = logging.getLogger("pyspark_abs")

Actions = list[AddAction | RemoveAction]
"""The actions of one Delta commit."""

Progress = Callable[[str], None]
"""Receives one line per step of a long operation."""

_CONFLICT_RETRIES = 10


def _quiet(_: str) -> None:
    return None


@dataclass(frozen=True)
class Compaction:
    """The outcome of compacting one state table or truncating one back-edge log.

    Attributes:
        table: The table id.
        as_of_epoch: The snapshot whose latest row per key was written, or whose consumed
            records were removed from the log.
        version: The table version of the compaction commit (None if nothing was done).
        files_before: Files the compaction replaced or removed.
        rows_before: Rows in those files.
        rows_after: Live keys written (0 for a back-edge log).
        skipped: Why nothing was committed although there was work: another compaction or
            a rollback changed the table since the snapshot (None otherwise).
    """

    table: str
    as_of_epoch: int
    version: int | None
    files_before: int
    rows_before: int
    rows_after: int
    skipped: str | None = None


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


@dataclass(frozen=True)
class Problem:
    """One thing :func:`validate` found broken.

    Attributes:
        epoch: The epoch concerned, if any.
        table: The table concerned, if any.
        message: What is wrong.
    """

    epoch: int | None
    table: str | None
    message: str

    def __str__(self) -> str:
        where = ", ".join(
            part
            for part in (
                f"epoch {self.epoch}" if self.epoch is not None else "",
                f"table {self.table}" if self.table else "",
            )
            if part
        )
        return f"{where}: {self.message}" if where else self.message


class CompactionPolicy:
    """When a running pipeline compacts its state table (see :class:`AbsConfig`).

    Compaction is due every ``every_epochs`` epochs, or once the changelog has grown to
    ``ratio`` times the live state (rows written since the last compaction plus live keys,
    over live keys). Zero turns a trigger off.
    """

    def __init__(self, every_epochs: int, ratio: float) -> None:
        self.every_epochs = every_epochs
        self.ratio = ratio
        self._epochs = 0
        self._rows = 0

    def observe(self, changed_rows: int, live_keys: int, epochs: int = 1) -> bool:
        """Count committed epochs; return whether compaction is due (and reset if so).

        Args:
            changed_rows: State rows the epochs wrote.
            live_keys: Live keys after them.
            epochs: How many epochs one commit made visible (a snapshot interval's group).
        """
        self._epochs += epochs
        self._rows += changed_rows
        due = (self.every_epochs and self._epochs >= self.every_epochs) or (
            self.ratio and self._rows + live_keys > self.ratio * max(live_keys, 1)
        )
        if due:
            self._epochs = self._rows = 0
        return bool(due)


def compact(
    root: str, *, progress: Progress = _quiet, config: AbsConfig | None = None
) -> list[Compaction]:
    """Compact a snapshot root as of its newest snapshot (see :func:`compact_snapshot`).

    Safe while the pipeline runs. The manifest is compacted too (small-file bin packing).
    ``config`` only matters for its injected faults.

    Raises:
        SnapshotNotFoundError: The root does not exist.
        CommitError: Delta kept reporting conflicts.
    """
    root = normalize_uri(root)
    store = DeltaStore()
    epochs = _load(store, root)
    snapshots = epochs.snapshots()
    if not snapshots:
        return []
    latest = snapshots[-1]
    results = compact_snapshot(
        store, latest, FaultInjector((config or AbsConfig()).faults), progress
    )
    progress("compacting _manifest")
    DeltaTable(f"{root}/_manifest").optimize.compact()
    return results


Fence = Callable[[str], None]
"""Raises :class:`~pyspark_abs.errors.FencingError` when the caller may no longer write
what it names (a pipeline run that lost its lease on the root)."""


def _unfenced(_: str) -> None:
    return None


def compact_snapshot(
    store: DeltaStore,
    snapshot: ManifestEntry,
    faults: FaultInjector,
    progress: Progress = _quiet,
    fence: Fence = _unfenced,
) -> list[Compaction]:
    """Compact the state tables and truncate the back-edge logs of a snapshot's root.

    ``fence`` is called before every commit attempt: a pipeline run's background compaction
    stops there once the run has lost the root (on-demand compaction needs no lease).

    Raises:
        CommitError: Delta kept reporting conflicts.
        FencingError: ``fence`` refused a commit.
    """
    results = []
    for table, uri in snapshot.tables.items():
        if table.startswith("state/"):
            progress(f"compacting {table} as of epoch {snapshot.epoch}")
            results.append(compact_table(store, table, uri, snapshot, faults, fence))
        elif table.startswith(BACKEDGE_PREFIX):
            progress(f"truncating {table} as of epoch {snapshot.epoch}")
            results.append(truncate_log(store, table, uri, snapshot, fence))
    return results


def compact_table(
    store: DeltaStore,
    table: str,
    uri: str,
    snapshot: ManifestEntry,
    faults: FaultInjector,
    fence: Fence = _unfenced,
) -> Compaction:
    """Rewrite one state table's latest row per key as of ``snapshot`` in one commit.

    The commit removes the files of the snapshot's table version. It is made only if every
    one of them is still in the table and the table was not restored or overwritten since
    that version (a rollback, restore or restore epoch); otherwise another compaction or a
    rollback got there first, the written files are deleted and nothing is committed
    (``skipped`` says why). The check and the commit are one: the commit is made exactly on
    the version checked, and checked again on a conflict.

    Raises:
        CommitError: Delta kept reporting conflicts.
    """
    version = snapshot.table_versions[table]
    keys: list[str] = json.loads(store.description(uri) or "{}")["key"]
    at_version = DeltaTable(uri, version=version)
    files = _add_actions(at_version)
    changes = store.read(uri, version)
    live = latest_per_key(changes, keys)
    if len(files) <= 1 and live.num_rows == changes.num_rows:
        return Compaction(table, snapshot.epoch, None, len(files), changes.num_rows, live.num_rows)
    schema = arrow_schema(at_version)
    target = TableTarget(table, uri, Kind.STATE, 0, schema, schema)
    prefix = compaction_prefix(snapshot.epoch)
    written = write_files(target, live, prefix, AbsConfig().target_file_bytes)
    faults.at(FaultStep.DURING_COMPACTION, snapshot.epoch)
    replaced = [(str(f["path"]), int(f["size_bytes"])) for f in files]

    what = f"compacting {table} at {uri} as of epoch {snapshot.epoch}"

    def actions(current: DeltaTable) -> Actions:
        fence(what)
        reason = superseded(current, version, [path for path, _ in replaced])
        if reason is not None:
            raise _Superseded(reason)
        now_ms = int(time.time() * 1000)
        todo: Actions = [RemoveAction(path, False, now_ms, size, {}) for path, size in replaced]
        todo += [AddAction(w.path, w.size_bytes, {}, now_ms, False, w.stats) for w in written]
        return todo

    try:
        committed, _ = _commit_retrying(store, uri, actions, what, "run compact again later")
    except _Superseded as skip:
        store.delete_files(uri, [w.path for w in written])
        log.info("%s: nothing committed, %s", what, skip.reason)
        return Compaction(
            table, snapshot.epoch, None, 0, changes.num_rows, live.num_rows, skip.reason
        )
    except (CommitError, FencingError):
        store.delete_files(uri, [w.path for w in written])
        raise
    return Compaction(table, snapshot.epoch, committed, len(files), changes.num_rows, live.num_rows)


def superseded(current: DeltaTable, since: int, removing: Iterable[str]) -> str | None:
    """Why removes planned at table version ``since`` must not be committed on ``current``.

    They must not when a file to remove is no longer in the table (another compaction or a
    rollback removed it: its rows may live on elsewhere, or be meant gone) or when the table
    was restored or overwritten after ``since`` (a rollback, restore or restore epoch
    replaced the state the plan was made from). None when they may be committed.
    """
    present = {str(a["path"]) for a in _add_actions(current)}
    gone = [path for path in removing if path not in present]
    if gone:
        return (
            f"file {unquote(gone[0])} of version {since} is no longer in the table "
            f"(version {current.version()}; {len(gone)} such file(s)): another compaction or "
            f"a rollback replaced it"
        )
    replaced = _replacing_commit(current, since)
    if replaced is not None:
        return f"the table was {replaced} after version {since}: a rollback or restore replaced it"
    return None


def _replacing_commit(current: DeltaTable, since: int) -> str | None:
    """The first commit after version ``since`` that restored or overwrote the table."""
    newer = int(current.version()) - since
    if newer <= 0:
        return None
    for commit in sorted(current.history(limit=newer), key=lambda c: int(c["version"])):
        if int(commit["version"]) <= since:
            continue
        operation = str(commit.get("operation", "")).upper()
        mode = str((commit.get("operationParameters") or {}).get("mode", "")).lower()
        if operation == "RESTORE" or mode == "overwrite":
            return f"{'restored' if operation == 'RESTORE' else 'overwritten'} at version " + str(
                commit["version"]
            )
    return None


class _Superseded(Exception):
    """A compaction's plan no longer fits the table: commit nothing."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def truncate_log(
    store: DeltaStore, table: str, uri: str, snapshot: ManifestEntry, fence: Fence = _unfenced
) -> Compaction:
    """Remove from a back-edge log the records a snapshot has consumed, in one commit.

    A run continuing from the snapshot, or from a later one, reads the log only from where
    the snapshot's loop head stopped (see :func:`~pyspark_abs.backedge.consumed_before`).
    Older snapshots' records in flight stay readable, and restorable: their table versions
    still reference the removed files, so vacuum keeps the files until they expire. The
    removes carry ``dataChange=false``, as compaction's do, so the pipeline's commits to the
    log never conflict with this one and the loop head skips it.

    Raises:
        CommitError: Delta kept reporting conflicts.
    """
    before = consumed_before(snapshot, table.removeprefix(BACKEDGE_PREFIX))
    at_before = _add_actions(DeltaTable(uri, version=before - 1)) if before else []
    consumed = {a["path"]: int(a.get("num_records") or 0) for a in at_before}

    what = f"truncating {table} at {uri} as of epoch {snapshot.epoch}"

    def removals(current: DeltaTable) -> Actions:
        fence(what)
        reason = superseded(current, snapshot.table_versions[table], ())
        if reason is not None:
            raise _Superseded(reason)
        now_ms = int(time.time() * 1000)
        return [
            RemoveAction(a["path"], False, now_ms, int(a["size_bytes"]), {})
            for a in _add_actions(current)
            if a["path"] in consumed
        ]

    try:
        version, removed = _commit_retrying(store, uri, removals, what, "run compact again later")
    except _Superseded as skip:
        log.info("%s: nothing committed, %s", what, skip.reason)
        return Compaction(table, snapshot.epoch, None, 0, 0, 0, skip.reason)
    rows = sum(consumed[action.path] for action in removed)
    return Compaction(table, snapshot.epoch, version, len(removed), rows, 0)


def expire(root: str, keep_last: int, *, dry_run: bool = False) -> list[int]:
    """Mark all but the newest ``keep_last`` snapshots EXPIRED; return the epochs marked.

    The epochs MERGED into an expired snapshot expire with it, in the same manifest commit.
    With ``dry_run``, return the epochs that would be marked and change nothing.

    Raises:
        ConfigError: ``keep_last`` is below 1.
        SnapshotNotFoundError: The root does not exist.
    """
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ConfigError(f"keep_last must be an integer of at least 1, got {keep_last!r}")
    root = normalize_uri(root)
    store = DeltaStore()
    epochs = _load(store, root)
    snapshots = epochs.snapshots()
    doomed = [
        epoch
        for snapshot in snapshots[: max(0, len(snapshots) - keep_last)]
        for epoch in [*epochs.merged_into(snapshot.epoch), snapshot.epoch]
        if epochs.status(epoch) is not EpochStatus.EXPIRED
    ]
    if dry_run:
        return doomed
    writer = EpochWriter(_owner(store, root), root, store, epochs, f"vacuum-{uuid.uuid4().hex}")
    writer.record_all(
        [
            entry.transition(EpochStatus.EXPIRED, run_id=writer.run_id, files=())
            for entry in (epochs.latest(e) for e in doomed)
            if entry is not None
        ]
    )
    return doomed


def vacuum(
    root: str,
    *,
    keep_last: int | None = None,
    min_age_seconds: float = 3600.0,
    dry_run: bool = False,
    progress: Progress = _quiet,
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
        dry_run: List what would expire and be deleted, and change nothing.
        progress: Receives a line per table.
        config: Only its injected faults matter.

    Raises:
        SnapshotNotFoundError: The root does not exist.
    """
    faults = FaultInjector((config or AbsConfig()).faults)
    expired = expire(root, keep_last, dry_run=dry_run) if keep_last is not None else []
    root = normalize_uri(root)
    store = DeltaStore()
    epochs = _load(store, root)
    expiring = set(expired)
    retained = [s for s in epochs.snapshots() if s.epoch not in expiring]
    decided = epochs.latest_decided()
    newest_decided = decided.epoch if decided is not None else -1
    tag = root_tag(root)
    deleted: dict[str, list[str]] = {}
    log_removed: dict[str, list[str]] = {}
    kept = 0
    for table, uri in _tables(epochs.entries).items():
        if not store.exists(uri):
            continue
        progress(f"vacuuming {table}")
        versions = {e.table_versions[table] for e in retained if table in e.table_versions}
        referenced = _referenced(store, uri, versions)
        in_flight = {f.path for e in epochs.pending() for f in e.files if f.table == table}
        replaced = _removed_paths(uri)
        doomed = []
        rule = _DeadFile(table, tag, newest_decided, min_age_seconds)
        for path, age in _data_files(uri):
            if path in referenced:
                continue
            if path not in in_flight and rule.dead(path, age, path in replaced):
                doomed.append(path)
            else:
                kept += 1
        doomed, late = _still_dead(store, root, table, uri, versions, doomed, expiring)
        kept += late
        if doomed and not dry_run:
            store.delete_files(uri, doomed)
            faults.at(FaultStep.DURING_VACUUM, newest_decided)
        if doomed:
            deleted[table] = sorted(doomed)
        if versions and table.startswith(("state/", BACKEDGE_PREFIX)) and not dry_run:
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

    def dead(self, path: str, age: float, replaced: bool) -> bool:
        """Whether a file no retained version references and no PREPARED epoch lists is dead.

        Args:
            path: The file's path under the table root.
            age: Seconds since it was last modified.
            replaced: Whether the table's log removes it (it was committed, then replaced).
        """
        name = file_name(path)
        if name is None:
            return False  # not written by pyspark-abs
        if not self.table.startswith(("state/", BACKEDGE_PREFIX)) and name.tag != self.tag:
            return False  # a sink another pipeline (or an older pyspark-abs) writes too
        if name.compaction:
            old_enough = age >= max(self.min_age_seconds, _ABANDONED_AFTER_SECONDS)
            return (replaced and age >= self.min_age_seconds) or old_enough
        return name.epoch <= self.newest_decided


def _referenced(store: DeltaStore, uri: str, versions: Iterable[int]) -> set[str]:
    """Files the given versions of a table and its latest version reference."""
    current = store.open(uri)
    paths = {unquote(a["path"]) for a in _add_actions(current)}
    for version in set(versions) - {int(current.version())}:
        paths |= {unquote(a["path"]) for a in _add_actions(DeltaTable(uri, version=version))}
    return paths


def _still_dead(
    store: DeltaStore,
    root: str,
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
    epochs = _load(store, root)
    versions = versions | {
        e.table_versions[table]
        for e in epochs.snapshots()
        if table in e.table_versions and e.epoch not in expiring
    }
    live = _referenced(store, uri, versions)
    live |= {f.path for e in epochs.pending() for f in e.files if f.table == table}
    still = [path for path in doomed if path not in live]
    return still, len(doomed) - len(still)


def validate(root: str, *, progress: Progress = _quiet) -> list[Problem]:
    """Check every retained snapshot of a root; return what is broken (empty: all sound).

    Raises:
        SnapshotNotFoundError: The root does not exist.
    """
    root = normalize_uri(root)
    store = DeltaStore()
    pipeline = _owner(store, root)
    root_id = manifest_root_id(store, root)
    try:
        epochs = open_manifest(store, root, pipeline)
    except AbsError as err:
        return [Problem(None, "_manifest", str(err))]
    checker = _SnapshotChecker(store, epochs)
    problems = checker.unreadable_tables()
    histories: dict[str, dict[int, dict[str, Any]]] = {}
    snapshots = epochs.snapshots()
    for number, entry in enumerate(snapshots, 1):
        progress(f"validating epoch {entry.epoch} ({number}/{len(snapshots)})")
        for table, version in entry.table_versions.items():
            uri = entry.tables[table]
            found = checker.table(entry, table)
            problems += found
            if found or checker.latest_unreadable(table):
                continue
            if entry.rows.get(table) and not entry.is_restore:
                if table not in histories:
                    histories[table] = _history(uri)
                expected = app_id(pipeline, table, root_id)
                problems += _check_txn(entry, table, version, histories[table], expected)
            if table.startswith("state/"):
                problems += _check_duplicates(store, entry, table, uri, version)
    return problems


def require_intact(root: str, epochs: EpochLog, epoch: int, consequence: str) -> None:
    """Refuse to build on a damaged snapshot, naming the newest intact one.

    Checks that every table version of the snapshot loads, that its files exist with the
    sizes the Delta log records, that it holds every file the epoch (and each epoch MERGED
    into it) prepared, and that each table's latest version loads (the next commit, restore
    or rollback builds on it).

    Args:
        root: The snapshot root.
        epochs: Its manifest.
        epoch: A COMMITTED or RESTORED epoch.
        consequence: What is refused, e.g. "The pipeline cannot continue from it."

    Raises:
        SnapshotDamagedError: The snapshot or one of its tables is damaged.
    """
    checker = _SnapshotChecker(DeltaStore(), epochs)
    entry = epochs.latest(epoch)
    assert entry is not None
    for table, uri in entry.tables.items():
        reason = checker.latest_unreadable(table)
        if reason is not None:
            raise SnapshotDamagedError(
                f"snapshot root {root}: the Delta log of table {table} at {uri} cannot be "
                f"read up to its latest version (epoch {epoch} is at version "
                f"{entry.table_versions.get(table)}): {reason}. {consequence} Nothing was "
                f"changed. Put the damaged log entry back from a backup, or move it and the "
                f"entries after it aside; pyspark-abs validate {root} lists every damaged epoch"
            )
    problems = checker.snapshot(entry)
    if not problems:
        return
    older = [e for e in reversed(epochs.snapshots()) if e.epoch < epoch]
    intact = next((e.epoch for e in older if not checker.snapshot(e)), None)
    fallback = (
        f"roll back to the newest intact snapshot, epoch {intact} "
        f"(pyspark_abs.rollback({root!r}, {intact}))"
        if intact is not None
        else "no older snapshot is intact either"
    )
    shown = "; ".join(f"table {p.table}: {p.message}" for p in problems[:3])
    more = f" and {len(problems) - 3} more problem(s)" if len(problems) > 3 else ""
    raise SnapshotDamagedError(
        f"epoch {epoch} of snapshot root {root} is damaged: {shown}{more}. {consequence} "
        f"Nothing was changed. Put the files back from a backup, or {fallback}; "
        f"pyspark-abs validate {root} lists every damaged epoch"
    )


def require_sound_start(root: str, epochs: EpochLog) -> None:
    """Refuse to start a pipeline whose newest snapshot is damaged (see require_intact).

    Raises:
        SnapshotDamagedError: The newest snapshot or one of its tables is damaged.
    """
    snapshots = epochs.snapshots()
    if snapshots:
        require_intact(root, epochs, snapshots[-1].epoch, "The pipeline cannot continue from it.")


class _SnapshotChecker:
    """Checks snapshots' tables, loading each table version once."""

    def __init__(self, store: DeltaStore, epochs: EpochLog) -> None:
        self.store = store
        self.epochs = epochs
        self._versions: dict[tuple[str, int], tuple[set[str], list[Problem]]] = {}
        self._latest: dict[str, str | None] = {}

    def snapshot(self, entry: ManifestEntry) -> list[Problem]:
        """Problems of every table of one snapshot."""
        return [p for table in entry.table_versions for p in self.table(entry, table)]

    def table(self, entry: ManifestEntry, table: str) -> list[Problem]:
        """Problems of one table of one snapshot (see :func:`require_intact`)."""
        version = entry.table_versions[table]
        key = (table, version)
        if key not in self._versions:
            self._versions[key] = _check_version(self.store, table, entry.tables[table], version)
        paths, problems = self._versions[key]
        found = [Problem(entry.epoch, p.table, p.message) for p in problems]
        if not found:
            found += [
                Problem(
                    entry.epoch,
                    table,
                    f"file {f.path}, which {_preparer(entry, member)} prepared, is not in "
                    f"version {version}: the commit lost it",
                )
                for member in self.epochs.group(entry.epoch)
                for f in member.files
                if f.table == table and f.path not in paths
            ]
        return found

    def latest_unreadable(self, table: str) -> str | None:
        """Why the table's latest version cannot be loaded, or None if it loads."""
        if table not in self._latest:
            uri = next(e.tables[table] for e in self.epochs.entries if table in e.tables)
            try:
                DeltaTable(uri)
                self._latest[table] = None
            except Exception as err:
                self._latest[table] = brief_error(err)
        return self._latest[table]

    def unreadable_tables(self) -> list[Problem]:
        """A problem for each table whose latest version cannot be loaded."""
        problems = []
        for table in sorted(_tables(e for e in self.epochs.snapshots())):
            reason = self.latest_unreadable(table)
            if reason is not None:
                problems.append(
                    Problem(None, table, f"the latest version cannot be loaded: {reason}")
                )
        return problems


def _preparer(snapshot: ManifestEntry, member: ManifestEntry) -> str:
    """Who prepared a file of a snapshot's group, as validate's messages say it."""
    if member.epoch == snapshot.epoch:
        return "the epoch"
    return f"epoch {member.epoch} (merged into this snapshot)"


def _check_version(
    store: DeltaStore, table: str, uri: str, version: int
) -> tuple[set[str], list[Problem]]:
    """The files of a table version, and problems: it does not load, files missing or cut."""
    try:
        at_version = DeltaTable(uri, version=version)
        actions = _add_actions(at_version)
    except Exception as err:
        if log_entries(uri).expired(version):
            return set(), [Problem(None, table, _expired(uri, version))]
        return set(), [
            Problem(None, table, f"version {version} cannot be loaded: {brief_error(err)}")
        ]
    paths = [unquote(a["path"]) for a in actions]
    sizes = store.file_sizes(uri, paths)
    problems = []
    for action, path, size in zip(actions, paths, sizes, strict=True):
        if size is None:
            problems.append(Problem(None, table, f"file {path} of version {version} is missing"))
        elif size != action["size_bytes"]:
            problems.append(
                Problem(
                    None,
                    table,
                    f"file {path} of version {version} has {size} bytes, the log records "
                    f"{action['size_bytes']}",
                )
            )
    return set(paths), problems


def _expired(uri: str, version: int) -> str:
    """Validate's message for a version whose log entries Delta's log retention deleted."""
    return (
        f"version {version} cannot be loaded: its Delta log entries expired and were deleted "
        f"by Delta's log retention (delta.logRetentionDuration, 30 days by default, applied "
        f"when a checkpoint is written); the data is not damaged but this snapshot cannot be "
        f"read any more. Expire it (pyspark-abs vacuum --keep-last), and set "
        f"delta.enableExpiredLogCleanup=false on the table at {uri} (pyspark-abs sets it on "
        f"the tables it creates) so that only vacuum removes the log of expired snapshots"
    )


def _history(uri: str) -> dict[int, dict[str, Any]]:
    return {int(c["version"]): c for c in DeltaTable(uri).history()}


def _check_txn(
    entry: ManifestEntry,
    table: str,
    version: int,
    history: dict[int, dict[str, Any]],
    expected: str,
) -> list[Problem]:
    commit = history.get(version, {})
    if commit.get(EPOCH_KEY) != str(entry.epoch) or commit.get(APP_ID_KEY) != expected:
        return [
            Problem(
                entry.epoch,
                table,
                f"the commit at version {version} carries transaction "
                f"{commit.get(APP_ID_KEY)!r} epoch {commit.get(EPOCH_KEY)!r}, expected "
                f"{expected!r} epoch {entry.epoch}",
            )
        ]
    return []


def _check_duplicates(
    store: DeltaStore, entry: ManifestEntry, table: str, uri: str, version: int
) -> list[Problem]:
    keys: list[str] = json.loads(store.description(uri) or "{}")["key"]
    changes = store.read(uri, version, columns=[*keys, EPOCH])
    epochs = np.asarray(changes[EPOCH].to_numpy(), dtype=np.int64)
    doubled = duplicate_changes(changes.filter(pa.array(epochs <= entry.epoch)), keys)
    if not doubled.num_rows:
        return []
    sample = doubled.slice(0, 3).to_pylist()
    return [
        Problem(
            entry.epoch,
            table,
            f"{doubled.num_rows} rows change a key twice in one epoch (an epoch was committed "
            f"twice), e.g. {sample}",
        )
    ]


def _commit_retrying(
    store: DeltaStore,
    uri: str,
    actions: Callable[[DeltaTable], Actions],
    what: str,
    again: str,
) -> tuple[int | None, Actions]:
    """Commit actions computed against the table's current version, again on a conflict.

    The commit is made exactly on the version the actions were computed against (Delta's
    own retry would rebase it onto newer commits unchecked: delta-rs accepts removes of
    files a concurrent commit already removed). Returns the committed version and actions
    (None and [] if there was nothing to do).

    Raises:
        CommitError: The commit failed, or conflicted with other writers every time.
    """
    for attempt in range(_CONFLICT_RETRIES):
        current = store.open(uri)
        todo = actions(current)
        if not todo:
            return None, []
        try:
            current.create_write_transaction(
                todo,
                mode="append",
                schema=current.schema(),
                commit_properties=CommitProperties(max_commit_retries=0),
            )
            current.update_incremental()
            return int(current.version()), todo
        except CommitFailedError as err:
            log.info("%s conflicted (attempt %d): %s", what, attempt + 1, err)
        except DeltaError as err:
            raise CommitError(f"{what} failed: {err}") from err
    raise CommitError(f"{what} conflicted {_CONFLICT_RETRIES} times with other writers; {again}")


def _add_actions(table: DeltaTable) -> list[dict[str, Any]]:
    """The add actions of a table version: path, size_bytes, ..."""
    actions: list[dict[str, Any]] = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    return actions


def _removed_paths(uri: str) -> set[str]:
    """Files the table's JSON log entries remove (committed once, replaced since)."""
    fs, base = pafs.FileSystem.from_uri(uri)
    selector = pafs.FileSelector(f"{base}/_delta_log", allow_not_found=True)
    removed: set[str] = set()
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or not info.path.endswith(".json"):
            continue
        try:
            with fs.open_input_stream(info.path) as stream:
                lines = stream.read().decode().splitlines()
        except (OSError, UnicodeDecodeError):
            continue  # a damaged or vanished entry: keep its files
        for line in lines:
            try:
                action = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(action, dict) and isinstance(action.get("remove"), dict):
                removed.add(unquote(str(action["remove"].get("path", ""))))
    return removed


def _data_files(uri: str) -> Iterable[tuple[str, float]]:
    """Data files under a table root (not its log): relative path and age in seconds."""
    fs, base = pafs.FileSystem.from_uri(uri)
    now = time.time()
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    for info in fs.get_file_info(selector):
        relative = info.path[len(base) :].lstrip("/")
        if info.type != pafs.FileType.File or relative.startswith("_delta_log"):
            continue
        if not relative.endswith(".parquet"):
            continue
        modified = info.mtime.timestamp() if info.mtime is not None else now
        yield relative, now - modified


def _tables(entries: Iterable[ManifestEntry]) -> dict[str, str]:
    tables: dict[str, str] = {}
    for entry in entries:
        tables.update(entry.tables)
    return tables


def _load(store: DeltaStore, root: str) -> EpochLog:
    return open_manifest(store, root, _owner(store, root))


def _owner(store: DeltaStore, root: str) -> str:
    owner = manifest_owner(store, root) if store.exists(f"{root}/_manifest") else None
    if owner is None:
        raise SnapshotNotFoundError(
            f"{root} is not a pyspark-abs snapshot root (it has no _manifest table)"
        )
    return owner
