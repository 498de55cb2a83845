"""Phase 2 of the two-phase commit: recording epoch transitions and committing tables.

:class:`EpochWriter` is the only code that appends to the manifest and commits an epoch's
tables. The coordinator uses it for micro-batch epochs; rollback, restore and written state
use it for restore epochs, so every change to a snapshot root goes through the same
decide-then-commit steps and the same recovery.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time

from pyspark_abs.errors import SnapshotRootError
from pyspark_abs.faults import FaultInjector, FaultStep
from pyspark_abs.lease import Lease, require_no_live_holder
from pyspark_abs.manifest import EpochLog, EpochStatus, ManifestEntry, entries_to_table
from pyspark_abs.store import DeltaStore, brief_error

log = logging.getLogger("pyspark_abs")


def app_id(pipeline: str, table: str) -> str:
    """The Delta application transaction id of a pipeline's table."""
    return f"pyspark-abs/{pipeline}/{table}"


class EpochWriter:
    """Appends transitions to a root's manifest and commits PREPARED epochs."""

    def __init__(
        self,
        pipeline: str,
        root: str,
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

    @property
    def manifest_uri(self) -> str:
        """Location of the ``_manifest`` table."""
        return f"{self.root}/_manifest"

    def record(self, entry: ManifestEntry) -> None:
        """Append an entry to the manifest (durably), then to the in-memory log.

        Raises:
            ManifestError: The transition is not allowed.
            SnapshotRootError: The manifest cannot be written.
            FencingError: Another run holds the root.
        """
        with self._lock:
            self.epochs.check(entry)
            if self.lease is not None or entry.status is not EpochStatus.EXPIRED:
                self.fence(f"epoch {entry.epoch} {entry.status.value}")
            try:
                self.store.append(self.manifest_uri, entries_to_table([entry]))
            except Exception as err:
                raise SnapshotRootError(
                    f"epoch {entry.epoch}: cannot record {entry.status.value} in the manifest "
                    f"at {self.manifest_uri}: {brief_error(err)}"
                ) from err
            self.epochs.record(entry)

    def fence(self, what: str) -> None:
        """Make sure this writer may write ``what`` to the root (see :mod:`pyspark_abs.lease`).

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
        """Commit every PREPARED epoch that has no outcome yet; return their epochs."""
        finished = []
        for entry in self.epochs.pending():
            log.info("recovery: committing epoch %d, PREPARED by run %s", entry.epoch, entry.run_id)
            self.commit(entry)
            finished.append(entry.epoch)
        return finished

    def commit(self, prepared: ManifestEntry) -> ManifestEntry:
        """Phase 2 for one PREPARED epoch: commit every table, then record the outcome.

        A micro-batch epoch appends its files and ends COMMITTED. A restore epoch replaces
        each state table's files with the installed state, restores each sink to its
        recorded version, and ends RESTORED. Idempotent: a table that already holds the
        epoch's transaction is not changed again, so recovery may run this any number of
        times.
        """
        epoch = prepared.epoch
        self.fence(f"the commit of epoch {epoch}")
        started = time.perf_counter()
        versions = {}
        for position, (table, uri) in enumerate(prepared.tables.items()):
            txn = app_id(self.pipeline, table)
            if table in prepared.restore_versions:
                version = self.store.restore_version(
                    uri, prepared.restore_versions[table], txn, epoch
                )
            else:
                files = [f for f in prepared.files if f.table == table]
                version = self.store.commit_files(
                    uri, files, txn, epoch, overwrite=prepared.is_restore
                ).version
            versions[table] = version
            if position == 0:
                self.faults.at(FaultStep.BETWEEN_TABLE_COMMITS, epoch)
        outcome = prepared.transition(
            EpochStatus.RESTORED if prepared.is_restore else EpochStatus.COMMITTED,
            run_id=self.run_id,
            files=(),
            table_versions=versions,
            commit_ms=_ms_since(started),
        )
        self.record(outcome)
        log.info(
            "epoch %d %s: %d rows, %d bytes, %s state keys; batch %.0f ms, pre-commit %.0f ms, "
            "align wait %.0f ms, align %.0f ms, prepare %.0f ms, commit %.0f ms, %d pending",
            epoch,
            outcome.status.value,
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


def now() -> dt.datetime:
    """The current time, as recorded in manifest entries."""
    return dt.datetime.now(dt.timezone.utc)


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000
