"""Phase 2 of the two-phase commit: recording epoch transitions and committing tables.

:class:`EpochWriter` is the only code that appends to the manifest and commits epochs'
tables. The coordinator uses it for groups of micro-batch epochs (one epoch each with
``snapshot_interval=1``); rollback, restore and written state use it for restore epochs, so
every change to a snapshot root goes through the same decide-then-commit steps and the same
recovery.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property

from pyspark_abs.errors import ConcurrentWriteError, ManifestError, SnapshotRootError
from pyspark_abs.faults import FaultInjector, FaultStep
from pyspark_abs.logs import logger
from pyspark_abs.manifest.entries import (
    TAG_STATUSES,
    EpochStatus,
    ManifestEntry,
    RestorePayload,
    entries_to_table,
)
from pyspark_abs.manifest.log import EpochLog, check_group, epoch_ranges, recovery_groups
from pyspark_abs.manifest.table import load_epoch_log, manifest_root_id
from pyspark_abs.protocol.lease import Lease, require_no_live_holder
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore, brief_error
from pyspark_abs.storage.transactions import app_id

log = logger(__name__)

MANIFEST_RETRIES = 8

_UNFENCED = frozenset({EpochStatus.EXPIRED, *TAG_STATUSES})
"""Transitions a writer without a lease records even while a run holds the root: they
change no table (retention's EXPIRED, savepoint names)."""
"""How often a manifest append is retried after other writers appended first."""


class EpochWriter:
    """Appends transitions to a root's manifest and commits PREPARED epochs."""

    def __init__(
        self,
        pipeline: str,
        root: SnapshotRoot,
        store: DeltaStore,
        epochs: EpochLog,
        run_id: str,
        faults: FaultInjector | None = None,
        lease: Lease | None = None,
    ) -> None:
        """Set up a writer.

        Args:
            pipeline: The pipeline the root belongs to.
            root: The snapshot root.
            store: Delta access.
            epochs: The root's manifest.
            run_id: Recorded with every entry this writer appends.
            faults: Faults to inject in phase 2.
            lease: The run's lease on the root. Without one (rollback, restore, retention),
                the writer refuses to decide or commit epochs while a live run holds it.
        """
        self.pipeline = pipeline
        self.root = root
        self.store = store
        self.epochs = epochs
        self.run_id = run_id
        self.faults = faults if faults is not None else FaultInjector(())
        self.lease = lease
        self._lock = threading.Lock()

    @cached_property
    def root_id(self) -> str | None:
        """The root's id, which its Delta transactions carry (None: an older root)."""
        return manifest_root_id(self.store, self.root)

    def app_id(self, table: str, query_id: str | None = None) -> str:
        """The application transaction id under which this root commits ``table``."""
        return app_id(self.pipeline, table, self.root_id, query_id)

    @property
    def manifest_uri(self) -> str:
        """Location of the ``_manifest`` table."""
        return self.root.manifest_uri

    def record(self, entry: ManifestEntry) -> None:
        """Append an entry to the manifest (durably), then to the in-memory log.

        Raises:
            ManifestError: The transition is not allowed.
            SnapshotRootError: The manifest cannot be written.
            FencingError: Another run holds the root.
        """
        self.record_all([entry])

    def record_all(self, entries: Sequence[ManifestEntry]) -> None:
        """Append transitions of distinct epochs to the manifest in one Delta commit.

        Either all of them are recorded or none is. The append is compare-and-swap: it
        commits against the manifest version the in-memory log reflects. When another writer
        appended first, the log is reloaded (in place) and each transition re-checked
        against it: an EXPIRED, or a commit outcome, that the other writer recorded
        identically is dropped, the rest is retried if still allowed (at most
        :data:`MANIFEST_RETRIES` times), and otherwise nothing is recorded.

        Raises:
            ManifestError: A transition is not allowed (also after another writer appended
                first: the message names what that writer recorded), or two entries are of
                one epoch.
            SnapshotRootError: The manifest cannot be written, or other writers kept
                appending first.
            FencingError: Another run holds the root, or this run's lease lapsed.
        """
        if not entries:
            return
        epochs = [e.epoch for e in entries]
        subject = f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epoch_ranges(epochs)}"
        statuses = "/".join(sorted({e.status.value for e in entries}))
        with self._lock:
            if len(set(epochs)) != len(epochs):
                raise ManifestError(f"{subject}: cannot record {statuses} for one epoch twice")
            pending = list(entries)
            self.epochs.check_all(pending)
            for _attempt in range(MANIFEST_RETRIES):
                if self.lease is not None or any(e.status not in _UNFENCED for e in pending):
                    self.fence(f"{subject} {statuses}")
                expected = self.epochs.version
                stamped = [
                    replace(e, manifest_version=None if expected is None else expected + 1)
                    for e in pending
                ]
                try:
                    version = self.store.append(
                        self.manifest_uri, entries_to_table(stamped), expected
                    )
                except ConcurrentWriteError:
                    pending = self._after_lost_race(pending, f"{subject} {statuses}")
                    if not pending:
                        return
                    continue
                except Exception as err:
                    raise SnapshotRootError(
                        f"{subject}: cannot record {statuses} in the manifest at "
                        f"{self.manifest_uri}: {brief_error(err)}"
                    ) from err
                for entry in stamped:
                    self.epochs.record(entry)
                if self.epochs.version is not None:
                    self.epochs.version = version
                return
            raise SnapshotRootError(
                f"{subject}: cannot record {statuses} in the manifest at {self.manifest_uri}: "
                f"other writers appended first {MANIFEST_RETRIES} times in a row. Try again "
                f"once they are done"
            )

    def _after_lost_race(self, entries: Sequence[ManifestEntry], what: str) -> list[ManifestEntry]:
        """Reload the manifest after another writer appended first; return what to retry.

        The in-memory log becomes the reloaded one. An EXPIRED entry another writer has
        recorded too is dropped (expiring is idempotent), and so is a commit outcome
        (COMMITTED, MERGED, RESTORED) another writer recorded identically, with the same
        snapshot and table versions (table commits are idempotent, so both committed the
        same cut). Every other entry must still be allowed.

        Raises:
            FencingError: This writer's run lost the root's lease meanwhile.
            ManifestError: An entry is no longer allowed: the message names the epoch and
                what the other writer recorded.
        """
        self.epochs.replace_with(load_epoch_log(self.store, self.manifest_uri))
        if self.lease is not None:
            self.fence(what)
        retry = []
        scratch = self.epochs.copy()
        for entry in entries:
            theirs = self.epochs.latest(entry.epoch)
            if entry.status in TAG_STATUSES and self.epochs.has_tag_row(entry):
                log.info(
                    "epoch %d: %s %r was recorded meanwhile", entry.epoch, entry.status, entry.tag
                )
                continue
            if (
                entry.status not in TAG_STATUSES
                and theirs is not None
                and _same_outcome(entry, theirs)
            ):
                log.info(
                    "epoch %d: %s was recorded by %s meanwhile; not recorded again",
                    entry.epoch,
                    entry.status.value,
                    theirs.run_id,
                )
                continue
            try:
                scratch.record(entry)
            except ManifestError as err:
                newest = self.epochs.latest_decided()
                shown = (
                    f"{theirs.status.value} for epoch {entry.epoch} (run {theirs.run_id}, "
                    f"{theirs.recorded_at.isoformat()})"
                    if theirs is not None
                    else f"{newest.status.value} for epoch {newest.epoch} (run {newest.run_id})"
                    if newest is not None
                    else "a change"
                )
                raise ManifestError(
                    f"epoch {entry.epoch}: {entry.status.value} is not recorded at snapshot "
                    f"root {self.root}: another writer recorded {shown} first ({err}). This "
                    f"writer must stop; look at the root with Snapshots or validate"
                ) from None
            retry.append(entry)
        return retry

    def fence(self, what: str) -> None:
        """Make sure this writer may write ``what`` to the root (see :mod:`.lease`).

        Raises:
            FencingError: This run lost the root's lease, or a writer without a lease meets a
                live run that holds it.
        """
        if self.lease is not None:
            self.lease.check(what)
        else:
            require_no_live_holder(self.root, what)

    def close(self) -> None:
        """Give up the run's lease on the root, if it holds one."""
        if self.lease is not None:
            self.lease.release()

    def recover(self) -> list[int]:
        """Commit every PREPARED epoch that has no outcome yet; return their epochs.

        The epochs are committed in the groups their run would have closed, the rest as one
        last group (see :func:`~pyspark_abs.manifest.log.recovery_groups`), so the last
        pending epoch becomes a snapshot.
        """
        snapshots = self.epochs.snapshots()
        last = snapshots[-1].epoch if snapshots else None
        finished = []
        for group in recovery_groups(self.epochs.pending(), last):
            log.info(
                "recovery: committing epoch(s) %s, PREPARED by run %s",
                _span(group),
                group[-1].run_id,
            )
            self.commit(group)
            finished += [e.epoch for e in group]
        return finished

    def commit(self, group: Sequence[ManifestEntry]) -> ManifestEntry:
        """Phase 2 for a group of PREPARED epochs: commit every table, record the outcome.

        A group of micro-batch epochs is committed with one Delta transaction per table,
        whose application transaction version is the group's last epoch s: it appends the
        files of every epoch of the group the table does not hold yet. Then one manifest
        append records COMMITTED for s (the snapshot) and MERGED for the earlier epochs.

        A restore epoch (always alone) replaces each state table's files with the installed
        state, restores each sink to its recorded version, and ends RESTORED.

        Idempotent: a table that already holds transaction s is not changed again, and one
        that holds an earlier epoch of the group gets the files of the later epochs only, so
        recovery may run this any number of times.

        Args:
            group: PREPARED entries, oldest first (see
                :func:`~pyspark_abs.manifest.log.check_group`).

        Returns:
            The COMMITTED (or RESTORED) entry of the group's last epoch.

        Raises:
            ManifestError: The entries cannot be committed as one group, or an earlier
                PREPARED epoch (or one inside the group's span) is not committed yet:
                groups are committed in epoch order.
            CommitError: A Delta commit failed; the epochs stay PREPARED.
            FencingError: Another run holds the root.
        """
        check_group(group)
        end = group[-1]
        epoch = end.epoch
        skipped = skipped_epochs(self.epochs, group)
        if skipped:
            raise ManifestError(
                f"epoch(s) {_span(group)} cannot be committed at snapshot root {self.root}: "
                f"earlier epoch(s) {epoch_ranges(skipped)} are PREPARED and not committed "
                f"yet, and groups are committed in epoch order. The run must stop; the next "
                f"start commits the pending epochs in order"
            )
        self.fence(f"the commit of epoch {epoch}")
        started = time.perf_counter()
        versions = {}
        restore = end.restore or RestorePayload()
        for position, (table, uri) in enumerate(end.tables.items()):
            txn = self.app_id(table)
            if table in restore.versions:
                version = self.store.restore_version(
                    uri, restore.versions[table], txn, epoch, self.root
                )
            else:
                files = {e.epoch: [f for f in e.files if f.table == table] for e in group}
                version = self.store.commit_files(
                    uri,
                    files,
                    txn,
                    epoch,
                    overwrite=end.is_restore,
                    schema=restore.schemas.get(table),
                    root=self.root,
                ).version
            versions[table] = version
            if position == 0:
                self.faults.at(FaultStep.BETWEEN_TABLE_COMMITS, epoch)
        outcome = end.transition(
            EpochStatus.RESTORED if end.is_restore else EpochStatus.COMMITTED,
            run_id=self.run_id,
            files=(),
            table_versions=versions,
            commit_ms=_ms_since(started),
            snapshot_epoch=epoch,
        )
        merged = [
            e.transition(EpochStatus.MERGED, run_id=self.run_id, files=(), snapshot_epoch=epoch)
            for e in group[:-1]
        ]
        self.record_all([*merged, outcome])
        log.info(
            "epoch %d %s%s: %d rows, %d bytes, %s state keys; batch %.0f ms, pre-commit %.0f ms, "
            "align wait %.0f ms, align %.0f ms, prepare %.0f ms, commit %.0f ms, %d pending",
            epoch,
            outcome.status.value,
            f" (snapshot of epochs {_span(group)})" if merged else "",
            sum(outcome.rows.values()),
            sum(outcome.bytes.values()),
            outcome.state_keys,
            outcome.batch_ms or 0.0,
            outcome.precommit_ms or 0.0,
            outcome.align_wait_ms or 0.0,
            outcome.align_ms or 0.0,
            outcome.prepare_ms or 0.0,
            outcome.commit_ms or 0.0,
            outcome.pending_epochs or 0,
        )
        self.faults.at(FaultStep.AFTER_COMMITTED, epoch)
        return outcome


def _same_outcome(mine: ManifestEntry, theirs: ManifestEntry) -> bool:
    """Whether another writer already recorded the transition ``mine``, to the same effect."""
    if mine.status is not theirs.status:
        return False
    if mine.status is EpochStatus.EXPIRED:
        return True
    return (
        mine.status in (EpochStatus.COMMITTED, EpochStatus.RESTORED, EpochStatus.MERGED)
        and mine.snapshot_epoch == theirs.snapshot_epoch
        and dict(mine.table_versions) == dict(theirs.table_versions)
    )


def skipped_epochs(epochs: EpochLog, group: Sequence[ManifestEntry]) -> list[int]:
    """PREPARED epochs not committed yet that committing ``group`` would skip.

    Those older than the group's last epoch that are not part of the group: a group may
    only be committed once every earlier PREPARED epoch is committed or merged.
    """
    members = {e.epoch for e in group}
    end = group[-1].epoch
    return [e.epoch for e in epochs.pending() if e.epoch < end and e.epoch not in members]


def now() -> dt.datetime:
    """The current time, as recorded in manifest entries."""
    return dt.datetime.now(dt.timezone.utc)


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def _span(group: Sequence[ManifestEntry]) -> str:
    return epoch_ranges(e.epoch for e in group)
