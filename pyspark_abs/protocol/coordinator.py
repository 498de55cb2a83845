"""The driver-side coordinator: one run of the snapshot protocol per micro-batch.

For micro-batch (epoch) e, called from ``foreachBatch``:

1. Process and pre-commit: one Spark job runs the operator and the pre-commit tasks; each
   partition writes its files and yields one barrier marker.
2. Align: exactly one marker per partition, and every listed file exists with its size.
3. Prepare: append PREPARED with the file list and source offsets to the manifest. This is
   the decision point: from here on epoch e is committed, at the latest by recovery.
4. Commit, once epoch e closes a group (``e - last >= snapshot_interval``, ``last`` being
   the previous group's end; with the default interval 1 every epoch does): one Delta
   transaction per table with the files of every epoch of the group, idempotent by
   application transaction (pipeline/table, version e); then one manifest append with
   COMMITTED for e, with every table's version, and MERGED for the group's earlier epochs.
   Sync mode does this before the micro-batch returns; async mode hands the group to the
   ordered committer. A micro-batch that does not close a group returns after PREPARED.

The open group (epochs PREPARED but not handed to phase 2) is committed as a group of its
own when the query ends (:meth:`EpochCoordinator.drain`, which the pipeline calls on stop);
after a failure it is left for recovery. One lock guards the open group and the hand-over,
so a drain from another thread and a micro-batch never commit groups out of order or twice.

A micro-batch that Spark replays after a crash is not processed again once its epoch is
decided: a PREPARED epoch joins the open group and is committed from its manifest entry
(a MERGED or COMMITTED one is left alone), and the replay installs the epoch's decided
state changes in Spark's own state store instead of running the operator again, so the
live state never drifts from the snapshot (an operator that depends on row order, or new
code, would compute other state). An idle epoch, a no-data micro-batch that Spark runs for timeouts
and that changes nothing, is not recorded: its snapshot would equal the previous one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import (
    AbsError,
    CommitError,
    QuiescenceError,
    rebuild_from_text,
)
from pyspark_abs.faults import FaultStep
from pyspark_abs.logs import logger, working_for
from pyspark_abs.manifest.entries import EpochDecision, EpochStatus, ManifestEntry, RunPayload
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.manifest.log import closes_group
from pyspark_abs.protocol.alignment import align, check_channel_epoch, check_files
from pyspark_abs.protocol.barrier import MARKER_DDL, BarrierMarker
from pyspark_abs.protocol.committer import Group, OrderedCommitter
from pyspark_abs.protocol.compaction import BackgroundCompactor, CompactionPolicy
from pyspark_abs.protocol.epoch_writer import EpochWriter, now
from pyspark_abs.protocol.layout import SnapshotLayout
from pyspark_abs.protocol.listeners import SnapshotListener, notify
from pyspark_abs.protocol.precommit import PrecommitPlan, PrecommitTask
from pyspark_abs.protocol.publishing import KafkaPublisher
from pyspark_abs.protocol.replay import check_replay_reached
from pyspark_abs.protocol.spark_checkpoint import BatchOffsets, CheckpointReader
from pyspark_abs.storage.files import FileEntry, delete_files
from pyspark_abs.storage.root import BACKEDGE_PREFIX, state_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logger(__name__)


class EpochCoordinator:
    """Runs the snapshot protocol for one pipeline run (see the module docstring)."""

    def __init__(
        self,
        layout: SnapshotLayout,
        config: AbsConfig,
        writer: EpochWriter,
        checkpoint: CheckpointReader,
        epoch_base: int = 0,
        epoch_limit: int | None = None,
        listeners: Sequence[SnapshotListener] = (),
        publishers: Sequence[KafkaPublisher] = (),
        slots: int | None = None,
    ) -> None:
        """Set up the protocol for one run.

        Args:
            layout: The pipeline's tables.
            config: Snapshot configuration.
            writer: Records transitions and commits epochs.
            checkpoint: The run's Spark checkpoint.
            epoch_base: Epoch of micro-batch 0: a checkpoint started after a restore
                epoch R numbers its micro-batches from R + 1.
            epoch_limit: The most epochs this run may process; the next one fails with
                :class:`QuiescenceError` before it writes anything.
            listeners: Told of each epoch this run commits or aborts.
            publishers: Publish each snapshot to its sinks' Kafka topics once committed.
            slots: The slots the run's checkpoint groups key groups into, recorded with
                each epoch (None: one group per key group).
        """
        self.slots = slots
        self.layout = layout
        self.config = config
        self.writer = writer
        self.store = writer.store
        self.epochs = writer.epochs
        self.checkpoint = checkpoint
        self.epoch_base = epoch_base
        self.epoch_limit = epoch_limit
        self.listeners = tuple(listeners)
        self.publishers = tuple(publishers)
        self.epochs_run = 0
        """Epochs this run has processed (replays of decided epochs not counted)."""
        self.run_id = writer.run_id
        self.faults = writer.faults
        self.failure: BaseException | None = None
        self._compactor = BackgroundCompactor(
            CompactionPolicy(config.compaction_every_epochs, config.compaction_ratio),
            self.faults,
            writer.fence,
            f"pyspark-abs-compaction-{layout.pipeline}",
        )
        self._idle = threading.Condition()
        self._idle_epochs = 0
        planned = checkpoint.planned_batches()
        # Micro-batches an earlier run planned but did not finish: Spark runs them again
        # first, with their old offsets, so one that read nothing says nothing about what
        # landed since (a run that stopped on it would skip that input).
        self._planned_before = planned[-1] if planned else -1
        self._query_id: str | None = None
        self._group_lock = threading.Lock()
        self._group: list[ManifestEntry] = []
        latest = self.latest_snapshot()
        self._last_end = latest.epoch if latest is not None else None
        self._committer: OrderedCommitter | None = None
        if config.snapshots and config.commit_mode == "async":
            self._committer = OrderedCommitter(self.commit_group, config.max_pending_epochs)

    @property
    def pending_epochs(self) -> int:
        """Epochs PREPARED in this run and not committed yet.

        Those of the open group, and (async) those waiting for the background committer.
        """
        waiting = self._committer.pending_epochs if self._committer else 0
        return len(self._group) + waiting

    def latest_snapshot(self) -> ManifestEntry | None:
        """The newest committed or restored epoch, as this run knows it."""
        snapshots = self.epochs.snapshots()
        return snapshots[-1] if snapshots else None

    def process_batch(self, batch: DataFrame, batch_id: int) -> None:
        """The ``foreachBatch`` function: run the protocol for one micro-batch."""
        try:
            with working_for(self.layout.pipeline):
                self._raise_if_failed(f"epoch {self.epoch_base + batch_id}")
                if self._committer is not None:
                    self._committer.raise_if_failed()
                if self.config.snapshots:
                    self._process_snapshot(batch, batch_id)
                else:
                    self._process_sinks_only(batch, batch_id)
        except BaseException as err:
            if self.failure is None:
                self.failure = err
            interrupted = spark_interruption(err)
            if interrupted is not None:
                raise InterruptedError(interrupted) from None
            raise

    def _raise_if_failed(self, what: str) -> None:
        """Refuse ``what`` after a failure of this run (a failed commit poisons it).

        A later group must not be committed while an earlier one is left PREPARED.

        Raises:
            CommitError: This run failed earlier.
        """
        failure = self.failure
        if failure is None or isinstance(failure, QuiescenceError):
            return
        raise CommitError(
            f"{what} is refused: run {self.run_id} of pipeline "
            f"{self.layout.pipeline!r} failed earlier ({type(failure).__name__}: {failure}). "
            f"Restart the pipeline: the next start commits the epochs left PREPARED"
        ) from failure

    @property
    def idle_epochs(self) -> int:
        """How many idle epochs (no input, no change) this run has planned and seen."""
        with self._idle:
            return self._idle_epochs

    def wait_for_idle(self, seen: int, timeout: float) -> bool:
        """Wait until more than ``seen`` idle epochs have happened; False on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._idle_epochs > seen, timeout)

    def drain(self) -> None:
        """Commit every epoch PREPARED so far, and wait until it is committed.

        The open group is committed as a group of its own, so its last epoch becomes a
        snapshot (as Flink's stop-with-savepoint), unless this run has failed: then it is
        left PREPARED for recovery. (A :class:`QuiescenceError` is no failure here: it
        stops the run before the next epoch starts.) Safe to call while micro-batches run.

        Raises:
            AbsError: A commit failed, or (sync mode) this run failed earlier.
        """
        with working_for(self.layout.pipeline):
            if self.failure is None or isinstance(self.failure, QuiescenceError):
                with self._group_lock:
                    if self._group:
                        self._close_group()
            elif self._committer is None:
                self._raise_if_failed("the drain of the open group")
            if self._committer is not None:
                self._committer.drain()

    def close(self) -> None:
        """Stop the background committer after it has committed what it holds.

        Also waits for a running background compaction to finish, lets the Kafka publishers
        go, then gives up the run's lease on the snapshot root.
        """
        with working_for(self.layout.pipeline):
            if self._committer is not None:
                self._committer.close()
            self._compactor.join()
            for publisher in self.publishers:
                publisher.close()
            self.writer.close()

    def _process_snapshot(self, batch: DataFrame, batch_id: int) -> None:
        epoch = self.epoch_base + batch_id
        decision = self.epochs.decide(epoch)
        if decision is not EpochDecision.PROCESS:
            prepared = self.epochs.prepared(epoch)
            if decision is EpochDecision.FINISH_REPLAY and prepared is not None:
                self._join_group(prepared)
            log.info("epoch %d is already decided; the replayed micro-batch is discarded", epoch)
            reached = {int(r["key_group"]) for r in batch.select("key_group").distinct().collect()}
            check_replay_reached(
                self.store,
                self.epochs,
                prepared,
                reached,
                pipeline=self.layout.pipeline,
                root=self.layout.root,
                operator=self.layout.operator,
                epoch=epoch,
            )
            return
        if self.epoch_limit is not None and self.epochs_run >= self.epoch_limit:
            loops = [t for t in self.layout.tables if t.startswith(BACKEDGE_PREFIX)]
            raise QuiescenceError(
                f"pipeline {self.layout.pipeline!r} did not reach quiescence within "
                f"{self.epoch_limit} epochs (the last committed is {epoch - 1}; epoch {epoch} "
                f"was not started). The loop over {loops or 'no back-edge'} may not "
                f"terminate: check that the operator stops sending records back, or raise "
                f"max_epochs; running again continues from epoch {epoch}"
            )
        self.epochs_run += 1
        offsets = self.checkpoint.offsets(batch_id)
        check_channel_epoch(self.layout.pipeline, epoch, offsets.source_offsets)
        # Step 1: process and pre-commit, in one Spark job.
        started = time.perf_counter()
        try:
            markers = self._precommit(batch, epoch)
        except BaseException as err:
            raise self._abort(epoch, (), _task_error(err)) from err
        batch_ms = _ms_since(started)
        # Step 2: align.
        started = time.perf_counter()
        try:
            aligned = align(self.layout.operator, epoch, markers, offsets.shuffle_partitions)
            check_files(epoch, aligned.files, self.layout.file_sizes)
            self.faults.at(FaultStep.AFTER_ALIGN, epoch)
        except BaseException as err:
            raise self._abort(epoch, [f for m in markers for f in m.files], err) from None
        align_ms = _ms_since(started)
        if not aligned.files and self._is_idle(offsets):
            log.debug("epoch %d read no input and changed nothing; it is not recorded", epoch)
            if batch_id > self._planned_before:
                with self._idle:
                    self._idle_epochs += 1
                    self._idle.notify_all()
            return
        # Step 3: prepare.
        started = time.perf_counter()
        previous = self.epochs.latest_decided()
        entry = self._entry(
            epoch,
            EpochStatus.PREPARED,
            num_partitions=aligned.num_partitions,
            key_groups=self.config.key_groups,
            run=self._run(slots=self.slots, snapshot_interval=self.config.snapshot_interval),
            tables=self.layout.tables,
            files=aligned.files,
            rows=aligned.rows_by_table(),
            bytes=aligned.bytes_by_table(),
            state_keys=((previous.state_keys or 0) if previous else 0) + aligned.keys_delta,
            source_offsets=offsets.source_offsets,
            # a restore's fresh checkpoint starts Spark's watermark at 0 (see OperatorPlan)
            watermark_ms=max(offsets.watermark_ms, previous.watermark_floor_ms if previous else 0),
            batch_ms=batch_ms,
            precommit_ms=aligned.precommit_ms,
            align_wait_ms=aligned.align_wait_ms,
            align_ms=align_ms,
            pending_epochs=self.pending_epochs,
        )
        self.writer.record(entry)
        entry = replace(entry, prepare_ms=_ms_since(started))
        self.faults.at(FaultStep.AFTER_PREPARED, epoch)
        # Step 4: commit the group this epoch closes, now or in the background.
        self._join_group(entry)

    def _join_group(self, prepared: ManifestEntry) -> None:
        """Add a PREPARED epoch to the open group; hand the group over if it closes it."""
        with self._group_lock:
            self._group.append(prepared)
            if closes_group(prepared.epoch, self._last_end, self.config.snapshot_interval):
                self._close_group()

    def _close_group(self) -> None:
        """Commit the open group now (sync) or in the background (async).

        The caller holds the group lock, so groups are handed over in epoch order and once.
        """
        group = tuple(self._group)
        self._group.clear()
        self._last_end = group[-1].epoch
        try:
            if self._committer is None:
                self.commit_group(group)
            else:
                self._committer.submit(group)
        except BaseException as err:
            if self.failure is None:
                self.failure = err  # poisons the run: no later group may overtake this one
            raise

    def commit_group(self, group: Group) -> None:
        """Phase 2 for a group of PREPARED epochs (see :meth:`EpochWriter.commit`).

        Listeners hear of the snapshot once, with the group's last epoch. Then, when the
        compaction policy says so, the state table is compacted and the back-edge logs
        truncated in the background (see :class:`BackgroundCompactor`).
        """
        outcome = self.writer.commit(group)
        for publisher in self.publishers:
            publisher.publish(self.epochs.entries)
        notify(self.listeners, SnapshotInfo.from_entry(outcome), committed=True)
        self._compactor.committed(group, outcome, state_table(self.layout.operator))

    def _process_sinks_only(self, batch: DataFrame, batch_id: int) -> None:
        """Snapshots off: pre-commit and commit sink outputs, one transaction per sink."""
        epoch = self.epoch_base + batch_id
        offsets = self.checkpoint.offsets(batch_id)
        try:
            markers = self._precommit(batch, epoch)
        except BaseException as err:
            raise _task_error(err) from err
        files = [f for m in markers for f in m.files]
        try:
            aligned = align(self.layout.operator, epoch, markers, offsets.shuffle_partitions)
            check_files(epoch, aligned.files, self.layout.file_sizes)
        except BaseException:
            self.layout.delete(files)
            raise
        for table, uri in self.layout.tables.items():
            mine = [f for f in aligned.files if f.table == table]
            txn = self.writer.app_id(table, self._current_query_id())
            if not self.store.commit_files(
                uri, {epoch: mine}, txn, epoch, root=self.layout.root
            ).committed:
                delete_files(uri, [f.path for f in mine])

    def _precommit(self, batch: DataFrame, epoch: int) -> list[BarrierMarker]:
        plan = PrecommitPlan(
            operator=self.layout.operator,
            epoch=epoch,
            targets=self.layout.targets,
            target_file_bytes=self.config.target_file_bytes,
            faults=self.config.faults,
            root_tag=self.layout.root.tag,
        )
        rows = batch.mapInArrow(PrecommitTask(plan), MARKER_DDL).collect()
        return [BarrierMarker.from_dict(r.asDict(recursive=True)) for r in rows]

    def _run(self, **fields: Any) -> RunPayload:
        """What this run records with an epoch: its checkpoint and commit mode, and ``fields``."""
        return RunPayload(
            checkpoint=self.checkpoint.location, commit_mode=self.config.commit_mode, **fields
        )

    def _entry(self, epoch: int, status: EpochStatus, **fields: Any) -> ManifestEntry:
        """A transition of ``epoch`` by this run, now (with the run's payload by default)."""
        fields.setdefault("run", self._run())
        return ManifestEntry(
            pipeline=self.layout.pipeline,
            epoch=epoch,
            status=status,
            recorded_at=now(),
            run_id=self.run_id,
            query_id=self._current_query_id(),
            batch_id=epoch - self.epoch_base,
            **fields,
        )

    def _abort(self, epoch: int, files: Sequence[FileEntry], err: BaseException) -> BaseException:
        """Record ABORTED (best effort), delete the epoch's listed files, return the error."""
        self.layout.delete(files)
        entry = self._entry(epoch, EpochStatus.ABORTED, error=f"{type(err).__name__}: {err}"[:4000])
        try:
            self.writer.record(entry)
        except AbsError as record_err:
            log.warning("epoch %d: could not record ABORTED: %s", epoch, record_err)
        notify(self.listeners, SnapshotInfo.from_entry(entry), committed=False)
        return err

    def _is_idle(self, offsets: BatchOffsets) -> bool:
        """Whether a micro-batch read no new input: Spark's no-data batches for timeouts."""
        if offsets.batch_id == 0:
            return False
        previous = self.checkpoint.offsets(offsets.batch_id - 1)
        return previous.source_offsets == offsets.source_offsets

    def _current_query_id(self) -> str | None:
        if self._query_id is None:
            self._query_id = self.checkpoint.query_id()
        return self._query_id


_INTERRUPTIONS = (
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
)


def spark_interruption(err: BaseException) -> str | None:
    """What to tell Spark when a stop interrupted ``foreachBatch``, or None if none did.

    Spark recognises a stop by matching its own pattern against the Python traceback of
    the error, and that pattern recurses once per character: a traceback holding a Java
    stack trace overflows the stream thread's stack (``StackOverflowError``). A short
    error in the form Spark matches ends the query as a stop.
    """
    texts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.append(str(current))
        current = current.__cause__ or current.__context__
    text = "\n".join(texts)
    name = next((n for n in _INTERRUPTIONS if n in text), None)
    if name is None:
        return None
    return f"py4j.protocol.Py4JJavaError: An error occurred while calling foreachBatch: {name}"


def _task_error(err: BaseException) -> BaseException:
    """The pyspark-abs error raised inside a Spark task, rebuilt from Spark's report."""
    rebuilt = rebuild_from_text(str(err))
    return rebuilt if rebuilt is not None else err


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1000
