"""Spark Connect: the snapshot protocol in the server's ``foreachBatch`` process.

Under Spark Connect (Databricks serverless and shared clusters), a ``foreachBatch`` function
does not run in the client: Spark pickles it and calls it in a Python process next to the
server's driver, with a Connect session of its own. The coordinator therefore cannot be an
object in the client. Instead the client sends a :class:`RemoteCoordinator`, which builds the
:class:`~pyspark_abs.protocol.coordinator.EpochCoordinator` in the server process on the first
micro-batch. The client acquires the root's lease when it starts the run (refusing a second
start), and the server-side run adopts it on its first micro-batch
(:meth:`~pyspark_abs.protocol.lease.Lease.adopt`): the lease then names the process that
writes and is renewed there, so a dead client's root is not taken over while its query still
commits. The client reads progress from the manifest (:class:`ConnectRun`) and releases the
lease when the query has stopped, which also ends the server-side renewals.
Checkpoints are read with pyarrow's file systems there.

What needs the client to see the coordinator cannot work and is refused with a
:class:`~pyspark_abs.errors.ConfigError`: the asynchronous committer (nobody could drain it
when the query ends), a snapshot interval above 1 (nobody could commit the last open group
when the query ends) and ``run()`` with processing-time timeouts (its idle detection).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import ConfigError
from pyspark_abs.faults import FaultInjector
from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import open_manifest
from pyspark_abs.protocol.coordinator import EpochCoordinator
from pyspark_abs.protocol.epoch_writer import EpochWriter
from pyspark_abs.protocol.layout import SnapshotLayout
from pyspark_abs.protocol.lease import Lease, LeaseRecord
from pyspark_abs.protocol.listeners import SnapshotListener
from pyspark_abs.protocol.publishing import KafkaPublisher
from pyspark_abs.protocol.spark_checkpoint import ArrowFiles, CheckpointReader
from pyspark_abs.storage.store import DeltaStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def is_connect(spark: SparkSession) -> bool:
    """Whether the session is a Spark Connect client.

    Decided by the session's class, without importing Spark Connect's client, whose packages
    (grpcio and others) a classic installation does not have.
    """
    return any(cls.__module__.startswith("pyspark.sql.connect") for cls in type(spark).__mro__)


def require_supported(pipeline: str, config: AbsConfig, stops_when_idle: bool) -> None:
    """Refuse what cannot work under Spark Connect (see the module docstring).

    Raises:
        ConfigError: The configuration needs a classic session.
    """
    if config.snapshots and config.commit_mode == "async":
        raise ConfigError(
            f"pipeline {pipeline!r}: under Spark Connect, epochs are committed in the server's "
            f"foreachBatch process, which the client cannot drain when the query stops; set "
            f"AbsConfig(commit_mode='sync') (or spark.abs.commitMode=sync)"
        )
    if config.snapshot_interval > 1:
        raise ConfigError(
            f"pipeline {pipeline!r}: under Spark Connect, epochs are committed in the server's "
            f"foreachBatch process, and the client cannot commit the last open group of "
            f"snapshot_interval={config.snapshot_interval} epochs when the query stops; set "
            f"AbsConfig(snapshot_interval=1) (or spark.abs.snapshotInterval=1)"
        )
    if stops_when_idle:
        raise ConfigError(
            f"pipeline {pipeline!r}: run() with processing-time timeouts waits for an idle "
            f"micro-batch that only the server sees under Spark Connect; use "
            f"start(processing_time=...) and stop() instead"
        )


def protocol_run(
    layout: SnapshotLayout,
    config: AbsConfig,
    writer: EpochWriter,
    checkpoint: CheckpointReader,
    lease: LeaseRecord,
    *,
    remote: bool,
    epoch_base: int,
    epoch_limit: int | None,
    listeners: Sequence[SnapshotListener],
    publishers: Sequence[KafkaPublisher],
    slots: int | None = None,
) -> tuple[EpochCoordinator | ConnectRun, Callable[[DataFrame, int], None]]:
    """This run of the snapshot protocol, and the function ``foreachBatch`` calls.

    A classic session runs the coordinator in the driver. A Spark Connect client sends a
    :class:`RemoteCoordinator`, which adopts the run's ``lease`` in the server, and follows
    the run in the manifest. ``slots`` is what the coordinator records (see
    :attr:`~pyspark_abs.manifest.entries.ManifestEntry.slots`).
    """
    if not remote:
        run = EpochCoordinator(
            layout,
            config,
            writer,
            checkpoint,
            epoch_base=epoch_base,
            epoch_limit=epoch_limit,
            listeners=listeners,
            publishers=publishers,
            slots=slots,
        )
        return run, run.process_batch
    remote_run = RemoteCoordinator(
        layout,
        config,
        checkpoint.location,
        lease,
        epoch_base,
        epoch_limit,
        listeners,
    )
    return ConnectRun(writer), remote_run


@dataclass
class RemoteCoordinator:
    """The picklable ``foreachBatch`` function sent to a Spark Connect server.

    Attributes:
        layout: The pipeline's tables.
        config: Snapshot configuration.
        checkpoint: The Spark checkpoint location.
        lease: The client run's lease, adopted by the server-side run.
        epoch_base: Epoch of micro-batch 0.
        epoch_limit: The most epochs this run may process.
        listeners: Told of each epoch (in the server's Python process).
    """

    layout: SnapshotLayout
    config: AbsConfig
    checkpoint: str
    lease: LeaseRecord
    epoch_base: int
    epoch_limit: int | None
    listeners: Sequence[SnapshotListener]
    _coordinator: EpochCoordinator | None = field(default=None, init=False, repr=False)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        """Run the snapshot protocol for one micro-batch, in the server's process."""
        if self._coordinator is None:
            self._coordinator = self._build()
        self._coordinator.process_batch(batch, batch_id)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_coordinator": None}

    def _build(self) -> EpochCoordinator:
        store = DeltaStore()
        lease = Lease.adopt(self.layout.root, self.lease)
        writer = EpochWriter(
            self.layout.pipeline,
            self.layout.root,
            store,
            EpochLog(),
            self.lease.run_id,
            FaultInjector(self.config.faults),
            lease,
        )
        if self.config.snapshots:
            writer.epochs = open_manifest(store, self.layout.root, self.layout.pipeline)
        return EpochCoordinator(
            self.layout,
            self.config,
            writer,
            CheckpointReader(self.checkpoint, ArrowFiles()),
            epoch_base=self.epoch_base,
            epoch_limit=self.epoch_limit,
            listeners=self.listeners,
        )


class ConnectRun:
    """The client's view of a run whose coordinator lives in the Connect server.

    It acquires the root's lease for the run (the server-side run adopts it), releases it
    when the query has stopped, and reads the run's progress from the manifest.
    """

    pending_epochs = 0
    """Always 0: epochs are committed synchronously under Spark Connect."""

    failure: BaseException | None = None
    """Always None: failures arrive as the query's exception."""

    def __init__(self, writer: EpochWriter) -> None:
        self.writer = writer
        self.run_id = writer.run_id

    @property
    def epochs_run(self) -> int:
        """Epochs this run has processed, as the manifest records them."""
        return len(
            {
                e.epoch
                for e in self._log().entries
                if e.run_id == self.run_id and e.status is EpochStatus.PREPARED
            }
        )

    def latest_snapshot(self) -> ManifestEntry | None:
        """The newest committed or restored epoch of the root."""
        snapshots = self._log().snapshots()
        return snapshots[-1] if snapshots else None

    def drain(self) -> None:
        """Nothing to wait for: the server commits each epoch before its micro-batch ends."""

    def close(self) -> None:
        """Give up the run's lease (held by the server-side run since its first epoch)."""
        self.writer.close()

    def _log(self) -> EpochLog:
        return open_manifest(self.writer.store, self.writer.root, self.writer.pipeline)
