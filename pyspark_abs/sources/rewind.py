"""Whether a restore can rewind a pipeline's sources to a snapshot's recorded offsets.

A run continuing from a restore epoch starts a fresh Spark checkpoint and resumes each
source right after the offsets of the snapshot. Only the sources of this package can be
started at a given offset, or skip what a snapshot had read; a snapshot read from any other
source (a socket, a rate source) cannot be continued, so rollback, restore and
``write_state`` refuse it up front instead of leaving a root whose next start fails.
"""

from __future__ import annotations

from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.sources.channel.plan import channel_offsets
from pyspark_abs.sources.channel.source import ChannelSource
from pyspark_abs.sources.delta.source import DeltaSource
from pyspark_abs.sources.delta.spark import SparkDeltaSource
from pyspark_abs.sources.files.source import FileSource
from pyspark_abs.sources.files.spark import SparkFileSource
from pyspark_abs.sources.kafka.source import KafkaSource
from pyspark_abs.storage.root import SnapshotRoot


def unrewindable(source_offsets: str | None) -> list[tuple[str, str]]:
    """The lines of an epoch's source offsets that no source of this package resumes from.

    Each line is one source's offset as Spark wrote it to the checkpoint's offset log; a
    ``DeltaSource`` (loop heads included), a ``FileSource``, a ``KafkaSource``, a
    ``SparkFileSource`` and a ``SparkDeltaSource`` at a version boundary can continue after
    theirs. Each line
    comes with the reason it cannot.
    """
    found = ((line, _why_not(line)) for line in (source_offsets or "").splitlines())
    return [(line, why) for line, why in found if why is not None]


def _why_not(line: str) -> str | None:
    try:
        SparkDeltaSource.position_of(line)
        return None
    except SourceError as err:
        return str(err)
    except ConfigError:
        pass
    for parse in (
        DeltaSource.offset_of,
        FileSource.offset_of,
        ChannelSource.offset_of,
        SparkFileSource.log_offset_of,
    ):
        try:
            parse(line)
            return None
        except ConfigError:
            pass
    try:
        KafkaSource.starting_offsets(line)
        return None
    except SourceError:
        return (
            f"its recorded offset is {line}: a socket, a rate source or another source that "
            f"no run can start at a given offset"
        )


def require_rewindable(snapshot: ManifestEntry, root: SnapshotRoot, action: str) -> None:
    """Refuse ``action`` when a run could not resume the sources after ``snapshot``.

    Raises:
        SourceError: The snapshot was read from a source that cannot be rewound.
    """
    lines = unrewindable(snapshot.source_offsets)
    if lines:
        raise SourceError(
            f"cannot {action}: no run can continue after epoch {snapshot.epoch} of {root} "
            f"({lines[0][1]}). Nothing was changed. Only a pyspark_abs.DeltaSource, "
            f"FileSource, KafkaSource, SparkFileSource or SparkDeltaSource can be rewound: "
            f"read files with FileSource or SparkFileSource, or land the input in a bronze "
            f"Delta table and read it with DeltaSource or SparkDeltaSource (see "
            f"docs/guide/savepoints.md)"
        )


def require_no_channels(snapshot: ManifestEntry, root: SnapshotRoot, action: str) -> None:
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
