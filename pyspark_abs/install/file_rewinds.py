"""Resolving, at install time, the files a snapshot's Spark file source had read.

Only the checkpoint that recorded a ``{"logOffset": n}`` can say which files it covers, and
a rollback moves that checkpoint aside while a restore leaves it with another root; so the
list is resolved before the restore epoch is recorded and kept in the new epoch's root.
"""

from __future__ import annotations

from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.protocol.spark_checkpoint import ArrowFiles, CheckpointReader
from pyspark_abs.sources.files.rewinds import record_rewind, rewound_files
from pyspark_abs.sources.files.spark import SparkFileSource, files_through
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore


def files_read(
    store: DeltaStore, target: ManifestEntry, target_root: SnapshotRoot
) -> list[str] | None:
    """The files Spark's file source had read through ``target``, or None if it read none.

    Raises:
        SourceError: The checkpoint that recorded ``target`` is gone or has lost its log.
    """
    for index, line in enumerate((target.source_offsets or "").splitlines()):
        try:
            batch = SparkFileSource.log_offset_of(line)
        except ConfigError:
            continue
        if target.is_restore:
            return rewound_files(store, target_root, target.epoch, target.run_id)
        log = _source_log(target, target_root, index)
        try:
            return files_through(log, batch)
        except SourceError as err:
            raise SourceError(
                f"cannot rewind Spark's file source to epoch {target.epoch} of {target_root}: "
                f"{err}. The root is unchanged"
            ) from None
    return None


def keep_files_read(
    store: DeltaStore,
    target: ManifestEntry | None,
    target_root: SnapshotRoot,
    root: SnapshotRoot,
    epoch: int,
    run_id: str,
) -> None:
    """Record in ``root`` the files restore epoch ``epoch`` (installed by ``run_id``) skips.

    Raises:
        SourceError: They cannot be resolved (nothing is recorded).
    """
    files = None if target is None else files_read(store, target, target_root)
    if files is not None:
        record_rewind(store, root, epoch, run_id, files)


def _source_log(target: ManifestEntry, root: SnapshotRoot, index: int) -> dict[str, str]:
    where = f"epoch {target.epoch} of {root}"
    checkpoint = target.run.checkpoint if target.run is not None else None
    if checkpoint is None or target.query_id is None:
        raise SourceError(f"{where} records no Spark checkpoint, whose log the rewind needs")
    found = CheckpointReader(checkpoint, ArrowFiles()).find(target.query_id)
    if found is None:
        raise SourceError(
            f"cannot rewind Spark's file source to {where}: the checkpoint that read it "
            f"({checkpoint}, query {target.query_id}) is gone, and only its log says "
            f"which files the epoch had read. The root is unchanged. Pick a snapshot read by "
            f"the current checkpoint, or restore the checkpoint directory"
        )
    return found.source_log(index)
