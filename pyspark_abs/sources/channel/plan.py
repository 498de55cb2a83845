"""Barrier alignment over channels: which upstream epoch a stage reads next (no I/O).

A channel is a Delta table that an upstream stage commits its outputs to; every upstream
epoch ``e`` ends at a barrier, the Delta version whose commit made ``e``'s rows visible. A
downstream stage reads its channels one upstream epoch per micro-batch, so that its epoch
``e`` holds exactly the rows of its upstream stages' epochs ``e``: the paper's alignment,
with the barrier kept in the channel instead of sent through it.

An offset ``{"source": "pyspark_abs_channel", "epoch": n, "barriers": {...}}`` means that
every upstream epoch before ``n`` is read; ``barriers`` gives each channel's barrier of
epoch ``n - 1`` (-1 when nothing is visible yet), for people reading the offset log.

A job-wide decision (a job rollback, a migration, written state) gives every stage one
restore epoch ``R`` and moves the readers' offsets past it. A reader that starts later (a
stage added to the job since) meets the upstream epochs that decision took back: it reads
them as empty, since they are not on the timeline it continues, and its offset names the
channels whose epoch it skipped (``taken_back``), so that its epoch there is no job cut.
A restore epoch of one stage alone is refused instead: its readers would keep rows it took
back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SOURCE_NAME = "pyspark_abs_channel"
"""The data source's short name, and the ``source`` tag of its offsets."""

NO_BARRIER = -1
"""The barrier of a channel before its first visible epoch."""


@dataclass(frozen=True)
class ChannelOffset:
    """A position in the aligned stream: every upstream epoch before ``epoch`` is read.

    Attributes:
        epoch: The next upstream epoch to read.
        barriers: Channel name to the Delta version that closed upstream epoch
            ``epoch - 1``; not part of the position.
    """

    epoch: int
    barriers: Mapping[str, int] = field(default_factory=dict, compare=False)
    taken_back: tuple[str, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The offset as Spark stores it in the checkpoint's offset log."""
        value = {"source": SOURCE_NAME, "epoch": self.epoch, "barriers": dict(self.barriers)}
        if self.taken_back:
            value["taken_back"] = list(self.taken_back)
        return value

    @classmethod
    def parse(cls, value: object) -> ChannelOffset:
        """Read an offset written by :meth:`to_dict`, or its JSON text.

        Raises:
            ValueError: ``value`` is not an offset of this source.
        """
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"{value!r} is not JSON: {err}") from None
        if not isinstance(value, Mapping) or value.get("source") != SOURCE_NAME:
            raise ValueError(f"{value!r} is not an offset of the {SOURCE_NAME} source")
        epoch, barriers = value.get("epoch"), value.get("barriers", {})
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"offset {dict(value)!r}: epoch must be an integer >= 0")
        if not isinstance(barriers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int) for k, v in barriers.items()
        ):
            raise ValueError(f"offset {dict(value)!r}: barriers must map names to versions")
        taken = value.get("taken_back", [])
        if not isinstance(taken, list) or not all(isinstance(n, str) for n in taken):
            raise ValueError(f"offset {dict(value)!r}: taken_back must list channel names")
        return cls(epoch, dict(barriers), tuple(taken))


def channel_offsets(source_offsets: str | None) -> list[ChannelOffset]:
    """The offsets of this source among an epoch's source offsets (one JSON text per line)."""
    found = []
    for line in (source_offsets or "").splitlines():
        try:
            found.append(ChannelOffset.parse(line))
        except ValueError:
            continue
    return found


def realigned(source_offsets: str | None, epoch: int) -> str | None:
    """An epoch's source offsets with every channel offset moved to upstream ``epoch``.

    A job rollback gives every stage the same restore epoch ``R``; each stage's next run
    then starts at epoch ``R + 1``, and its channels must resume at upstream epoch
    ``R + 1`` too, past the upstream epochs the rollback took back.
    """
    if source_offsets is None:
        return None
    lines = []
    for line in source_offsets.splitlines():
        try:
            offset = ChannelOffset.parse(line)
        except ValueError:
            lines.append(line)
            continue
        lines.append(json.dumps(ChannelOffset(epoch, offset.barriers).to_dict()))
    return "\n".join(lines)


@dataclass(frozen=True)
class UpstreamEpoch:
    """One upstream epoch whose outputs are committed (COMMITTED, MERGED, RESTORED, EXPIRED).

    Attributes:
        epoch: The upstream epoch.
        barrier: The channel table's Delta version that made its outputs visible.
        restored_from: For a restore epoch (a rollback), the epoch whose snapshot it installs.
        job: Whether the restore epoch belongs to a job-wide decision.
    """

    epoch: int
    barrier: int | None = None
    restored_from: int | None = None
    job: bool = False


@dataclass(frozen=True)
class Upstream:
    """One channel's upstream history, as its manifest shows it now.

    Attributes:
        stage: The upstream stage's name, for messages.
        epochs: The visible epochs by number. An epoch before the newest one that is not
            here was idle (a no-data micro-batch that changed nothing) and holds no rows.
    """

    stage: str
    epochs: Mapping[int, UpstreamEpoch]

    @classmethod
    def of(cls, stage: str, epochs: Iterable[UpstreamEpoch]) -> Upstream:
        """The history of ``stage`` from its epochs."""
        return cls(stage, {e.epoch: e for e in epochs})

    @property
    def visible_through(self) -> int:
        """The newest visible epoch, or -1 if none is."""
        return max(self.epochs, default=-1)

    def barrier(self, epoch: int) -> int:
        """The Delta version that closed ``epoch`` (the one before, for an idle epoch)."""
        for number in range(epoch, -1, -1):
            entry = self.epochs.get(number)
            if entry is not None and entry.barrier is not None:
                return entry.barrier
        return NO_BARRIER

    def taken_back(self, epoch: int) -> bool:
        """Whether a job-wide decision took ``epoch`` back: a reader skips its rows."""
        return any(
            r.job and r.restored_from is not None and r.restored_from < epoch < r.epoch
            for r in self.epochs.values()
        )

    def refusal(self, epoch: int) -> str | None:
        """Why a downstream stage may not read ``epoch`` as a micro-batch, or None.

        A restore epoch, or an epoch that a later restore epoch rolled back, belongs to a
        rollback of this stage alone (unless a job-wide decision made the restore epoch):
        the downstream stage already read, or would read, rows that the rollback took back.
        """
        entry = self.epochs.get(epoch)
        if entry is not None and entry.restored_from is not None and not entry.job:
            return (
                f"upstream stage {self.stage!r} was rolled back on its own: its epoch {epoch} "
                f"is a restore epoch that installs its epoch {entry.restored_from}"
            )
        for restore in self.epochs.values():
            origin = restore.restored_from
            if not restore.job and origin is not None and origin < epoch < restore.epoch:
                return (
                    f"upstream stage {self.stage!r} was rolled back on its own: its epoch "
                    f"{epoch} was taken back by restore epoch {restore.epoch}, which installs "
                    f"its epoch {origin}"
                )
        return None


def next_epoch(start: int, upstreams: Iterable[Upstream], frontier: int | None = None) -> int:
    """The end offset's epoch of the micro-batch that starts at upstream epoch ``start``.

    ``start + 1`` once every channel has made epoch ``start`` visible (one epoch per
    micro-batch keeps the stage's epoch numbers equal to its upstream stages'); ``start``
    while any has not, or when ``start`` is beyond ``frontier``.

    Raises:
        ValueError: An upstream stage was rolled back on its own at ``start``.
    """
    ready = True
    for upstream in upstreams:
        if upstream.visible_through < start:
            ready = False
            continue
        refusal = upstream.refusal(start)
        if refusal is not None:
            raise ValueError(refusal)
    if not ready or (frontier is not None and start > frontier):
        return start
    return start + 1


def frontier_of(upstreams: Iterable[Upstream]) -> int:
    """The newest epoch visible in every channel (-1 if one has none)."""
    return min((u.visible_through for u in upstreams), default=-1)
