"""Alignment: has every partition acknowledged the epoch, exactly once?

This is the barrier alignment of the ABS paper, done once per epoch on the driver: the
snapshot of epoch e may be taken only when every parallel instance of the operator has
acknowledged barrier e.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pyspark_abs.errors import AlignmentError, PrecommitFileError
from pyspark_abs.protocol.barrier import BarrierMarker
from pyspark_abs.sources.channel.plan import channel_offsets
from pyspark_abs.storage.files import FileEntry


@dataclass(frozen=True)
class AlignedEpoch:
    """The aligned acknowledgements of one epoch.

    Attributes:
        epoch: The epoch.
        num_partitions: How many partitions acknowledged it.
        files: Every pre-committed file, in partition order.
        keys_delta: Net change of the number of live keys.
        precommit_ms: The slowest partition's pre-commit time.
        align_wait_ms: Time between the first and the last partition's acknowledgement:
            how long the fastest partition's barrier waited for the slowest.
    """

    epoch: int
    num_partitions: int
    files: tuple[FileEntry, ...]
    keys_delta: int
    precommit_ms: float
    align_wait_ms: float

    def rows_by_table(self) -> dict[str, int]:
        """Rows pre-committed per table."""
        totals: dict[str, int] = defaultdict(int)
        for f in self.files:
            totals[f.table] += f.num_rows
        return dict(totals)

    def bytes_by_table(self) -> dict[str, int]:
        """Bytes pre-committed per table."""
        totals: dict[str, int] = defaultdict(int)
        for f in self.files:
            totals[f.table] += f.size_bytes
        return dict(totals)


def align(
    operator: str, epoch: int, markers: Sequence[BarrierMarker], num_partitions: int
) -> AlignedEpoch:
    """Check that each of ``num_partitions`` partitions acknowledged ``epoch`` exactly once.

    Raises:
        AlignmentError: A marker is missing, repeated, or belongs to another epoch,
            operator or partition range.
    """
    where = f"epoch {epoch} of operator {operator!r}"
    strangers = [m for m in markers if m.epoch != epoch or m.operator != operator]
    if strangers:
        first = strangers[0]
        raise AlignmentError(
            f"{where}: got a marker of epoch {first.epoch} of operator {first.operator!r} "
            f"(partition {first.partition}); the micro-batch mixed epochs, restart the query"
        )
    counts = Counter(m.partition for m in markers)
    repeated = sorted(p for p, n in counts.items() if n > 1)
    outside = sorted(p for p in counts if not 0 <= p < num_partitions)
    missing = sorted(set(range(num_partitions)) - set(counts))
    if repeated or outside or missing:
        problems = []
        if missing:
            problems.append(f"no marker from partition(s) {_few(missing)}")
        if repeated:
            problems.append(f"several markers from partition(s) {_few(repeated)}")
        if outside:
            problems.append(f"markers from unknown partition(s) {_few(outside)}")
        raise AlignmentError(
            f"{where}: expected one barrier marker from each of {num_partitions} partitions, "
            f"but {'; '.join(problems)}. Nothing was committed; restart the query to replay "
            f"the epoch"
        )
    ordered = sorted(markers, key=lambda m: m.partition)
    acked = [m.acked_at_ms for m in ordered]
    return AlignedEpoch(
        epoch=epoch,
        num_partitions=num_partitions,
        files=tuple(f for m in ordered for f in m.files),
        keys_delta=sum(m.keys_delta for m in ordered),
        precommit_ms=max((m.precommit_ms for m in ordered), default=0.0),
        align_wait_ms=max(acked, default=0.0) - min(acked, default=0.0),
    )


def check_files(
    epoch: int,
    files: Sequence[FileEntry],
    sizes: Callable[[Sequence[FileEntry]], Sequence[int | None]],
) -> None:
    """Check that every listed file exists with its recorded size.

    Args:
        epoch: The epoch, for the message.
        files: The files to check.
        sizes: Returns each file's size on storage, or None when it is missing.

    Raises:
        PrecommitFileError: A file is missing or has another size.
    """
    problems = []
    for entry, size in zip(files, sizes(files), strict=True):
        if size is None:
            problems.append(f"{entry.table}/{entry.path} is missing")
        elif size != entry.size_bytes:
            problems.append(
                f"{entry.table}/{entry.path} has {size} bytes, the marker says {entry.size_bytes}"
            )
    if problems:
        raise PrecommitFileError(
            f"epoch {epoch}: pre-committed file(s) damaged before commit: "
            f"{_few(problems, '; ')}. Nothing was committed; restart the query to replay "
            f"the epoch"
        )


def check_channel_epoch(pipeline: str, epoch: int, source_offsets: str | None) -> None:
    """Require a stage's epoch to read exactly its upstream stages' epoch of the same number.

    The channel source reads one upstream epoch per micro-batch, so micro-batch ``epoch``
    must end right after upstream epoch ``epoch``.

    Raises:
        AlignmentError: The micro-batch read another upstream epoch.
    """
    for offset in channel_offsets(source_offsets):
        if offset.epoch != epoch + 1:
            raise AlignmentError(
                f"pipeline {pipeline!r}: epoch {epoch} read its channels up to upstream "
                f"epoch {offset.epoch - 1}, not {epoch}: the stage's epochs no longer match "
                f"its upstream stages'. Was the stage started on a checkpoint of another "
                f"job, or restored without its upstream stages? Roll back the whole job "
                f"(Job.rollback) to realign it"
            )


def _few(items: Sequence[object], separator: str = ", ") -> str:
    shown = separator.join(str(i) for i in items[:5])
    return shown + (f" and {len(items) - 5} more" if len(items) > 5 else "")
