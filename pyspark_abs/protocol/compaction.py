"""Compaction: the latest row per key as of a snapshot, in one Delta commit beside the run.

The state table grows by the changed keys of every epoch (seed 003's incremental
checkpoints). **Compaction** rewrites the latest row per key as of a snapshot in one Delta
commit that removes the files it replaces (``dataChange=false``); epochs committed
meanwhile append other files, so it runs beside a running pipeline and retries when Delta
reports a conflict. Older epochs stay readable: they are read at their own table version.
A back-edge log grows by every record sent around the loop; compaction removes the files
whose records the snapshot had consumed, the same way.

The coordinator compacts in the background after a snapshot when the policy says so, and
:func:`pyspark_abs.upkeep.compaction.compact` compacts on demand; both commit through here.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import (
    CommitError,
    FencingError,
)
from pyspark_abs.faults import FaultInjector, FaultStep
from pyspark_abs.logs import background, logger
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.operators.changelog import latest_per_key
from pyspark_abs.operators.envelope import Kind
from pyspark_abs.protocol.precommit import TableTarget, write_files
from pyspark_abs.sources.backedge_log import consumed_before
from pyspark_abs.storage.files import add_actions, delete_files, files_at
from pyspark_abs.storage.rewrites import Actions, commit_retrying, superseded
from pyspark_abs.storage.root import BACKEDGE_PREFIX, STATE_PREFIX, compaction_prefix, file_name
from pyspark_abs.storage.schemas import arrow_schema
from pyspark_abs.storage.store import DeltaStore

log = logger(__name__)


Progress = Callable[[str], None]
"""Receives one line per step of a long operation."""


def quiet(_: str) -> None:
    """A :data:`Progress` that reports nothing."""
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


Fence = Callable[[str], None]
"""Raises :class:`~pyspark_abs.errors.FencingError` when the caller may no longer write
what it names (a pipeline run that lost its lease on the root)."""


def _unfenced(_: str) -> None:
    return None


class BackgroundCompactor:
    """Compacts a running pipeline's root in a background thread when its policy says so.

    One compaction runs at a time and the pipeline does not wait for it. Compaction is an
    optimisation: a failed one is logged and the next one retries; a fenced one (the run
    lost the root) stops.
    """

    def __init__(
        self, policy: CompactionPolicy, faults: FaultInjector, fence: Fence, name: str
    ) -> None:
        self._policy = policy
        self._faults = faults
        self._fence = fence
        self._name = name
        self._thread: threading.Thread | None = None

    def committed(
        self, group: Sequence[ManifestEntry], snapshot: ManifestEntry, table: str
    ) -> None:
        """Count a committed group of epochs, and start a compaction of ``snapshot`` if due.

        Args:
            group: The group's epochs.
            snapshot: The snapshot the group's commit made.
            table: The state table, whose growth the policy follows.
        """
        if table not in snapshot.tables:
            return
        changed = sum(e.rows.get(table, 0) for e in group)
        due = self._policy.observe(changed, snapshot.state_keys or 0, len(group))
        if due and (self._thread is None or not self._thread.is_alive()):
            self._thread = background(self._compact, self._name, snapshot)
            self._thread.start()

    def join(self) -> None:
        """Wait for a running compaction to finish."""
        if self._thread is not None:
            self._thread.join()

    def _compact(self, snapshot: ManifestEntry) -> None:
        try:
            for result in compact_snapshot(DeltaStore(), snapshot, self._faults, fence=self._fence):
                log.info(
                    "compacted %s as of epoch %d: %d rows in %d files -> %d rows (version %s)",
                    result.table,
                    result.as_of_epoch,
                    result.rows_before,
                    result.files_before,
                    result.rows_after,
                    result.version,
                )
        except FencingError as err:
            log.warning("background compaction as of epoch %d stopped: %s", snapshot.epoch, err)
        except Exception as err:
            log.warning("background compaction as of epoch %d failed: %s", snapshot.epoch, err)


def compact_snapshot(
    store: DeltaStore,
    snapshot: ManifestEntry,
    faults: FaultInjector,
    progress: Progress = quiet,
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
        if table.startswith(STATE_PREFIX):
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
    at_version = store.at_version(uri, version)
    files = add_actions(at_version)
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
        committed, _ = commit_retrying(store, uri, actions, what, "run compact again later")
    except _Superseded as skip:
        delete_files(uri, [w.path for w in written])
        reason = _already_compacted(store.open(uri), snapshot.epoch) or skip.reason
        log.info("%s: nothing committed, %s", what, reason)
        return Compaction(table, snapshot.epoch, None, 0, changes.num_rows, live.num_rows, reason)
    except (CommitError, FencingError):
        delete_files(uri, [w.path for w in written])
        raise
    return Compaction(table, snapshot.epoch, committed, len(files), changes.num_rows, live.num_rows)


def _already_compacted(current: DeltaTable, epoch: int) -> str | None:
    """Say so if another compaction as of ``epoch`` or later already holds the table."""
    names = [file_name(str(a["path"])) for a in add_actions(current)]
    compacted = [n.epoch for n in names if n is not None and n.compaction]
    if not compacted or max(compacted) < epoch:
        return None
    return (
        f"already compacted as of epoch {max(compacted)} by another compaction (table "
        f"version {current.version()}); nothing left to do"
    )


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
    the snapshot's loop head stopped (see :func:`consumed_before`).
    Older snapshots' records in flight stay readable, and restorable: their table versions
    still reference the removed files, so vacuum keeps the files until they expire. The
    removes carry ``dataChange=false``, as compaction's do, so the pipeline's commits to the
    log never conflict with this one and the loop head skips it.

    Raises:
        CommitError: Delta kept reporting conflicts.
    """
    before = consumed_before(snapshot, table.removeprefix(BACKEDGE_PREFIX))
    at_before = files_at(uri, before - 1) if before else []
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
            for a in add_actions(current)
            if a["path"] in consumed
        ]

    try:
        version, removed = commit_retrying(store, uri, removals, what, "run compact again later")
    except _Superseded as skip:
        log.info("%s: nothing committed, %s", what, skip.reason)
        return Compaction(table, snapshot.epoch, None, 0, 0, 0, skip.reason)
    rows = sum(consumed[action.path] for action in removed)
    return Compaction(table, snapshot.epoch, version, len(removed), rows, 0)
