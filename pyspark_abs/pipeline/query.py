"""The run handle of a started pipeline: its query, progress, stop and cleanup."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from pyspark.errors import StreamingQueryException

from pyspark_abs.errors import (
    AbsError,
    CommitError,
    ConfigError,
    rebuild_from_text,
)
from pyspark_abs.logs import logger
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.operators.contract import TimeoutMode
from pyspark_abs.pipeline.connect import (
    ConnectRun,
)
from pyspark_abs.pipeline.start import Declared
from pyspark_abs.protocol.coordinator import EpochCoordinator
from pyspark_abs.snapshots.reading import Snapshots
from pyspark_abs.sources.backedge_log import in_flight_count
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.tags import check_name, tag

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery

    from pyspark_abs.pipeline.backedge import BackEdge

log = logger(__name__)


@dataclass(frozen=True)
class Quiescence:
    """How a run of :meth:`Pipeline.run_until_quiescent` ended.

    Attributes:
        epoch: The committed epoch whose snapshot is quiescent: the sources had nothing
            more to read and no back-edge record was in flight. None if nothing ran.
        epochs_run: Epochs the run processed.
        seconds: Wall time of the run, start-up included.
    """

    epoch: int | None
    epochs_run: int
    seconds: float


class PipelineQuery:
    """A running pipeline: its Spark streaming query and its snapshot coordinator."""

    def __init__(
        self,
        query: StreamingQuery,
        coordinator: EpochCoordinator | ConnectRun,
        pipeline: Declared,
        recovered_epochs: list[int],
        stop_when_idle: bool = False,
    ) -> None:
        self.query = query
        self._stop_when_idle = stop_when_idle
        self.pipeline = pipeline
        self.recovered_epochs = recovered_epochs
        """Epochs an earlier run left PREPARED and this run committed on start."""
        self._coordinator = coordinator
        self._finished = False

    @property
    def run_id(self) -> str:
        """Id of this pipeline run, recorded with every manifest entry it writes."""
        return self._coordinator.run_id

    @property
    def is_active(self) -> bool:
        """Whether the streaming query is running."""
        return bool(self.query.isActive)

    @property
    def pending_epochs(self) -> int:
        """PREPARED epochs not committed yet: the open group's and the committer's."""
        return self._coordinator.pending_epochs

    @property
    def epochs_run(self) -> int:
        """Epochs this run has processed."""
        return self._coordinator.epochs_run

    def latest_snapshot(self) -> ManifestEntry | None:
        """The newest committed or restored epoch of the snapshot root, as this run knows it."""
        return self._coordinator.latest_snapshot()

    def drain(self) -> None:
        """Commit every epoch PREPARED so far and wait until it is committed.

        With ``snapshot_interval`` > 1 the open group is committed early, so its last epoch
        becomes a snapshot and its outputs visible. Safe to call while the query runs.
        """
        self._coordinator.drain()

    def until_quiescent(self, back_edges: Sequence[BackEdge], started: float) -> Quiescence:
        """Process until no input is left and no back-edge record is in flight, then stop.

        See :meth:`Pipeline.run_until_quiescent`; ``started`` is the run's start time.
        """
        store = DeltaStore()
        try:
            while True:
                self.process_all_available()
                self.drain()
                latest = self.latest_snapshot()
                if latest is None or not any(
                    in_flight_count(store, latest, edge.edge_id) for edge in back_edges
                ):
                    break
        finally:
            self.stop()
        outcome = Quiescence(
            epoch=None if latest is None else latest.epoch,
            epochs_run=self.epochs_run,
            seconds=time.perf_counter() - started,
        )
        log.info(
            "pipeline %s is quiescent at epoch %s after %d epoch(s) in %.1f s",
            self.pipeline.name,
            outcome.epoch,
            outcome.epochs_run,
            outcome.seconds,
        )
        return outcome

    def await_termination(self, timeout: int | None = None) -> bool:
        """Wait for the query to end, then commit what is PREPARED and stop the committer.

        Args:
            timeout: Seconds to wait; None waits until the query ends.

        Returns:
            Whether the query has ended.

        Raises:
            AbsError: The pipeline failed; the error says where and what to do.
        """
        interrupted = False
        try:
            if self._stop_when_idle:
                ended, interrupted = self._await_idle(timeout, stop=True)
            elif timeout is None:
                self.query.awaitTermination()
                ended = True
            else:
                ended = bool(self.query.awaitTermination(timeout))
        except StreamingQueryException as err:
            self._finish(failed=True)
            self._raise(err)
        if ended:
            self._finish(failed=interrupted)
        return ended

    def process_all_available(self) -> None:
        """Block until the query has processed everything available in its sources.

        For operators with processing-time timeouts, Spark's own ``processAllAvailable``
        never returns, because timeout micro-batches keep running; this waits instead for a
        micro-batch that reads no input and changes nothing.
        """
        try:
            if self.pipeline.plan.timeout is TimeoutMode.PROCESSING_TIME:
                self._await_idle(None, stop=False)
            else:
                self.query.processAllAvailable()
        except StreamingQueryException as err:
            self._finish(failed=True)
            self._raise(err)

    def _await_idle(self, timeout: int | None, stop: bool) -> tuple[bool, bool]:
        """Wait for the next idle epoch (or the end of the query), then maybe stop.

        Returns whether the query has ended, and whether stopping it interrupted a
        micro-batch. Spark runs timeout micro-batches back to back, so the stop may cut the
        one after the idle epoch short; like :meth:`stop`, the run then ends without an
        error and leaves that epoch to the next start.
        """
        coordinator = self._coordinator
        if not isinstance(coordinator, EpochCoordinator):
            raise ConfigError(
                f"pipeline {self.pipeline.name!r}: waiting for an idle micro-batch of an "
                f"operator with processing-time timeouts is not possible under Spark Connect "
                f"(only the server sees it); stop the query with stop()"
            )
        seen = coordinator.idle_epochs
        waited = 0
        while timeout is None or waited < timeout:
            if self.query.awaitTermination(1):
                return True, False
            waited += 1
            if coordinator.wait_for_idle(seen, timeout=0):
                if not stop:
                    return False, False
                failed_before = coordinator.failure is not None
                self.query.stop()
                return True, not failed_before and coordinator.failure is not None
        return False, False

    def stop(self, *, savepoint: str | None = None) -> SnapshotInfo | None:
        """Stop the query, commit every PREPARED epoch, and stop the committer.

        With ``snapshot_interval`` > 1 the open group is committed, so the last PREPARED
        epoch becomes a snapshot; after a failure it is left for the next start to recover.

        Args:
            savepoint: Name the snapshot the pipeline stopped at, once committed: a named
                savepoint, which retention keeps and rollback and restore accept (see
                :func:`~pyspark_abs.tag`).

        Returns:
            The named snapshot, with ``savepoint``; else None.

        Raises:
            ConfigError: ``savepoint`` is not a valid name, or already names a snapshot
                (checked before the query stops).
            CommitError: With ``savepoint``: the run had failed, so its last epochs are left
                for the next start and nothing was named.
        """
        root = self.pipeline.root
        if savepoint is not None:
            check_name(savepoint)
            named = Snapshots(root).tags().get(savepoint)
            if named is not None:
                raise ConfigError(
                    f"savepoint {savepoint!r} of {root} already names epoch {named}; untag it "
                    f"or choose another name (the pipeline is still running)"
                )
        self.query.stop()
        failure = self._coordinator.failure
        self._finish(failed=failure is not None)
        if savepoint is None:
            return None
        latest = Snapshots(root).latest()
        if failure is not None or latest is None:
            raise CommitError(
                f"pipeline {self.pipeline.name!r} stopped without a snapshot to name "
                f"{savepoint!r}: "
                + (f"the run failed ({failure})" if failure is not None else "it has none")
                + ". Start it again and stop it with the savepoint once an epoch is committed"
            )
        return tag(root, latest.epoch, savepoint)

    def _finish(self, failed: bool) -> None:
        if self._finished:
            return
        self._finished = True
        try:
            self._coordinator.drain()
        except AbsError:
            if not failed:
                raise
        finally:
            self._coordinator.close()

    def _raise(self, err: StreamingQueryException) -> NoReturn:
        """Raise the pyspark-abs error that ended the query, else Spark's error.

        The pyspark-abs error is raised alone: Spark's report of it, with its Java stack
        traces, goes to the log at DEBUG level.
        """
        failure = self._coordinator.failure or rebuild_from_text(str(err))
        if isinstance(failure, AbsError):
            log.debug("query %s ended with: %s", self.pipeline.name, err)
            raise failure from None
        if failure is not None:
            raise failure from err
        raise err
