"""Validation: checks every retained snapshot of a root.

**Validation** checks every retained snapshot: table versions exist, their files exist with
the recorded sizes, they hold the files of every epoch of the snapshot's group, commits
carry the epoch's application transaction, and no key has two changes in one epoch. It also
lists decided epochs that no start can commit, because files they need are gone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa

from pyspark_abs.errors import (
    AbsError,
    SnapshotDamagedError,
)
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import (
    manifest_root_id,
    open_manifest,
    root_owner,
    tables_of,
)
from pyspark_abs.operators.changelog import duplicate_changes
from pyspark_abs.operators.schema import EPOCH
from pyspark_abs.protocol.compaction import Progress, quiet
from pyspark_abs.storage.commits import commits_between
from pyspark_abs.storage.files import add_actions, damaged, file_sizes, missing_files
from pyspark_abs.storage.log_files import log_entries
from pyspark_abs.storage.rewrites import history
from pyspark_abs.storage.root import BACKEDGE_PREFIX, MANIFEST_TABLE, STATE_PREFIX, SnapshotRoot
from pyspark_abs.storage.store import DeltaStore, brief_error
from pyspark_abs.storage.transactions import APP_ID_KEY, EPOCH_KEY, app_id


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


def validate(root: str, *, progress: Progress = quiet) -> list[Problem]:
    """Check every retained snapshot of a root; return what is broken (empty: all sound).

    Decided epochs that no start can commit, because files they need are gone, are listed
    too (a rollback replaces them: see :func:`~pyspark_abs.rollback`).

    Raises:
        SnapshotNotFoundError: The root does not exist.
    """
    root = SnapshotRoot(root)
    store = DeltaStore()
    pipeline = root_owner(store, root)
    root_id = manifest_root_id(store, root)
    try:
        epochs = open_manifest(store, root, pipeline)
    except AbsError as err:
        return [Problem(None, MANIFEST_TABLE, str(err))]
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
                    histories[table] = history(uri)
                expected = app_id(pipeline, table, root_id)
                problems += _check_txn(entry, table, version, histories[table], expected)
            if table.startswith(STATE_PREFIX):
                problems += _check_duplicates(store, entry, table, uri, version)
    for entry in epochs.pending():
        gone = missing_for_commit(store, entry, lambda t: app_id(pipeline, t, root_id))
        if gone is not None:
            message = f"decided (PREPARED) but no start can commit it: {gone}"
            problems.append(Problem(entry.epoch, None, message))
    return problems


def require_intact(root: SnapshotRoot, epochs: EpochLog, epoch: int, consequence: str) -> None:
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


def require_sound_start(root: SnapshotRoot, epochs: EpochLog) -> None:
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
                self.store.open(uri)
                self._latest[table] = None
            except Exception as err:
                self._latest[table] = brief_error(err)
        return self._latest[table]

    def unreadable_tables(self) -> list[Problem]:
        """A problem for each table whose latest version cannot be loaded."""
        problems = []
        for table in sorted(tables_of(e for e in self.epochs.snapshots())):
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
        actions = add_actions(store.at_version(uri, version))
    except Exception as err:
        if log_entries(uri).expired(version):
            return set(), [Problem(None, table, _expired(uri, version))]
        return set(), [
            Problem(None, table, f"version {version} cannot be loaded: {brief_error(err)}")
        ]
    paths = [unquote(a["path"]) for a in actions]
    sizes = file_sizes(uri, paths)
    erased = _erased(store, table, uri, version) if None in sizes else frozenset()
    problems = []
    for action, path, size in zip(actions, paths, sizes, strict=True):
        if size is None:
            if path not in erased:
                problems.append(
                    Problem(None, table, f"file {path} of version {version} is missing")
                )
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


def _erased(store: DeltaStore, table: str, uri: str, version: int) -> frozenset[str]:
    """Files of a sink's ``version`` that another writer removed since (a ``DELETE``).

    Once vacuumed they are gone on purpose (a person's data erased, say): the sink as of
    that version can no longer be read, but the root is not damaged. Tables only
    pyspark-abs writes (state, back-edge logs) have none.
    """
    if table.startswith((STATE_PREFIX, BACKEDGE_PREFIX)):
        return frozenset()
    current = int(store.open(uri).version())
    return frozenset(
        path
        for commit in commits_between(uri, version + 1, current)
        if not commit.ours
        for path in (*commit.removed, *commit.rewritten)
    )


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


def missing_for_commit(
    store: DeltaStore, entry: ManifestEntry, app_id_of: Callable[[str], str]
) -> str | None:
    """What is gone that PREPARED ``entry`` still needs to commit, or None.

    ``app_id_of`` gives the application transaction id under which the root commits a
    table: a table that holds the epoch's transaction needs nothing more.
    """
    for table, uri in entry.tables.items():
        if not store.exists(uri):
            continue  # recovery's own error says more than a guess would
        done = store.open(uri).transaction_version(app_id_of(table))
        if done is not None and done >= entry.epoch:
            continue
        restored = entry.restore.versions if entry.restore is not None else {}
        if table in restored:
            version = restored[table]
            gone = missing_files(uri, version)
            if gone:
                return (
                    f"{len(gone)} file(s) of version {version} of {table} at {uri}, which it "
                    f"restores, are gone ({gone[0]} among them)"
                )
            continue
        found = damaged(uri, [f for f in entry.files if f.table == table])
        if found is not None:
            written, size = found
            what = "is gone" if size is None else f"has {size} bytes, not {written.size_bytes}"
            return f"its file {written.path} of {table} at {uri} {what}"
    return None
