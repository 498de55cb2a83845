"""Whether a restore can rewind a pipeline's sources to a snapshot's recorded offsets.

A run continuing from a restore epoch starts a fresh Spark checkpoint and resumes each
source right after the offsets of the snapshot. Only the sources of this package can be
started at a given offset; a snapshot read from any other source (Spark's file source, a
socket) cannot be continued, so rollback, restore and ``write_state`` refuse it up front
instead of leaving a root whose next start fails.
"""

from __future__ import annotations

from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.sources.channel import ChannelSource
from pyspark_abs.sources.channel_plan import channel_offsets
from pyspark_abs.sources.delta import DeltaSource
from pyspark_abs.sources.file_source import FileSource
from pyspark_abs.sources.kafka import KafkaSource


def unrewindable(source_offsets: str | None) -> list[str]:
    """The lines of an epoch's source offsets that no source of this package resumes from.

    Each line is one source's offset as Spark wrote it to the checkpoint's offset log; a
    ``DeltaSource`` (loop heads included), a ``FileSource`` and a ``KafkaSource`` can start
    right after theirs.
    """
    return [line for line in (source_offsets or "").splitlines() if not _rewindable(line)]


def _rewindable(line: str) -> bool:
    for parse in (DeltaSource.offset_of, FileSource.offset_of, ChannelSource.offset_of):
        try:
            parse(line)
            return True
        except ConfigError:
            pass
    try:
        KafkaSource.starting_offsets(line)
        return True
    except SourceError:
        return False


def require_rewindable(snapshot: ManifestEntry, root: str, action: str) -> None:
    """Refuse ``action`` when a run could not resume the sources after ``snapshot``.

    Raises:
        SourceError: The snapshot was read from a source that cannot be rewound.
    """
    lines = unrewindable(snapshot.source_offsets)
    if lines:
        raise SourceError(
            f"cannot {action}: epoch {snapshot.epoch} of {root} was read from a source that "
            f"cannot be rewound (its recorded offset is {lines[0]}; a file directory or a "
            f"socket), so no run could continue from it. Nothing was changed. Only a "
            f"pyspark_abs.DeltaSource, FileSource or KafkaSource can be rewound: read files "
            f"with FileSource, or land the input in a bronze Delta table and read it with "
            f"DeltaSource (see the README's Savepoints section)"
        )


def require_no_channels(snapshot: ManifestEntry, root: str, action: str) -> None:
    """Refuse ``action`` on one stage of a job: its epochs must stay its upstreams'.

    Raises:
        ConfigError: The snapshot read channels of upstream stages.
    """
    if channel_offsets(snapshot.source_offsets):
        raise ConfigError(
            f"cannot {action}: {root} is a stage of a job (epoch {snapshot.epoch} read the "
            f"outputs of upstream stages through a ChannelSource), and its epochs must keep "
            f"matching its upstream stages'. Nothing was changed. Roll back the whole job "
            f"with Job.rollback (or `pyspark-abs job rollback`)"
        )
