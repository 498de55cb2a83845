"""Snapshot listeners: each epoch as it is committed or aborted, like StreamingQueryListener."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark_abs.logs import logger

if TYPE_CHECKING:
    from pyspark_abs.manifest.info import SnapshotInfo


log = logger(__name__)


class SnapshotListener:
    """Receives a pipeline's epochs as they end, like Spark's ``StreamingQueryListener``.

    Subclass it, override what you need, and pass instances to ``Pipeline(listeners=...)``.
    In async mode the callbacks run on the background committer's thread. A callback that
    raises is logged and ignored: it cannot fail or delay the commit beyond its own run time.
    With ``snapshot_interval`` > 1, :meth:`on_epoch_committed` is called once per snapshot
    (with the group's last epoch); the epochs merged into it are in
    :meth:`Snapshots.metrics() <pyspark_abs.snapshots.reading.Snapshots.metrics>`.

    Example::

        class ToMetrics(SnapshotListener):
            def on_epoch_committed(self, info):
                statsd.timing("abs.commit_ms", info.commit_ms)
    """

    def on_epoch_committed(self, info: SnapshotInfo) -> None:
        """Epoch ``info.epoch`` is COMMITTED: its state, outputs and logs are visible.

        With ``snapshot_interval`` > 1 so are those of the epochs merged into it.
        """

    def on_epoch_aborted(self, info: SnapshotInfo) -> None:
        """Epoch ``info.epoch`` was ABORTED (``info.error`` says why); nothing of it is visible."""


def notify(listeners: Sequence[SnapshotListener], info: SnapshotInfo, *, committed: bool) -> None:
    """Call each listener's callback for ``info``, logging (not raising) their failures."""
    for listener in listeners:
        try:
            if committed:
                listener.on_epoch_committed(info)
            else:
                listener.on_epoch_aborted(info)
        except Exception as err:  # a listener must not break the protocol
            log.warning(
                "snapshot listener %s failed on epoch %d: %s: %s",
                type(listener).__name__,
                info.epoch,
                type(err).__name__,
                err,
            )
