"""Copying a snapshot into a new snapshot root, as the new root's first (restore) epoch."""

from __future__ import annotations

from dataclasses import replace

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import SnapshotRootError
from pyspark_abs.install.installing import (
    install_tables,
    installed_table,
    open_writer,
    shown,
    snapshot_of,
    write_rows,
)
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.protocol.epoch_writer import EpochWriter
from pyspark_abs.sources.channel.plan import realigned
from pyspark_abs.sources.rewind import require_rewindable
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import STATE_PREFIX, SnapshotRoot
from pyspark_abs.storage.schemas import arrow_schema
from pyspark_abs.storage.store import DeltaStore, TableSpec


def copy_snapshot(
    source: EpochWriter,
    target: ManifestEntry,
    asked: int | str,
    writer: EpochWriter,
    config: AbsConfig,
    restore_epoch: int,
    job: str | None = None,
) -> SnapshotInfo:
    """Install ``target`` of ``source``'s root in the new root ``writer`` writes.

    Each state table and back-edge log is created in the new root with the snapshot's rows;
    sinks are not copied (the new root gets its own). Running it again after an
    interruption finishes it.

    Args:
        source: The writer of the root copied from (only read).
        target: The snapshot copied.
        asked: The epoch or savepoint name the user gave, for messages.
        writer: The writer of the new root.
        config: File size and injected faults.
        restore_epoch: The new root's first epoch.
        job: The job root of a job-wide restore.

    Raises:
        SourceError: ``target`` was read from a source that cannot be rewound.
        SnapshotRootError: The new root is the source, or holds other epochs already.
    """
    root, store, into, name = source.root, source.store, writer.root, writer.pipeline
    require_rewindable(target, root, f"restore {shown(asked)} into {into}")
    if into == root:
        raise SnapshotRootError(
            f"restore copies a snapshot into another root; to go back to {shown(asked)} in "
            f"{root} itself, use rollback({root!r}, {asked!r})"
        )
    origin = f"restored from {root} epoch {target.epoch}"
    writer.recover()
    if writer.epochs.entries:
        done = writer.epochs.latest(restore_epoch)
        if len(writer.epochs.snapshots()) == 1 and done is not None and done.origin == origin:
            return SnapshotInfo.from_entry(done)  # an interrupted restore, now finished
        raise SnapshotRootError(
            f"{into} already holds epochs of pipeline {name!r}; restore into a new root"
        )
    tables: dict[str, str] = {}
    files: list[FileEntry] = []
    rows: dict[str, int] = {}
    for table, uri in target.tables.items():
        installed = installed_table(store, table, uri, target)
        if installed is None:
            continue
        new_uri = f"{into}/{table}"
        schema = installed.schema if table.startswith(STATE_PREFIX) else None
        store.ensure_table(
            TableSpec(
                table,
                new_uri,
                schema if schema is not None else arrow_schema(store.open(uri)),
                (),
                store.description(uri),
            )
        )
        files += write_rows(store, table, new_uri, installed, restore_epoch, config)
        tables[table] = new_uri
        rows[table] = installed.num_rows
    return install_tables(
        writer,
        target,
        restore_epoch,
        tables=tables,
        files=files,
        rows=rows,
        restore_versions={},
        origin=origin,
        job=job,
        target_root=root,
        target_epochs=source.epochs,
    )


def restore_stage(
    root: SnapshotRoot,
    epoch: int,
    into: EpochWriter,
    restore_epoch: int,
    *,
    job: str,
    config: AbsConfig,
) -> SnapshotInfo:
    """Copy one stage of a job into the new root ``into`` writes, as ``restore_epoch``.

    Every stage of a job restore gets the same restore epoch, and a stage's channels
    resume at upstream epoch ``restore_epoch + 1``, so the new job's stages keep one
    epoch numbering. Repeating it after an interruption finishes it.

    Raises:
        SnapshotNotFoundError: ``epoch`` is not a snapshot of the stage.
        SnapshotRootError: ``into`` already holds other epochs.
    """
    source = open_writer(DeltaStore(), root, None, config)
    target = snapshot_of(source.epochs, epoch, source.root)
    moved = replace(target, source_offsets=realigned(target.source_offsets, restore_epoch + 1))
    return copy_snapshot(source, moved, epoch, into, config, restore_epoch, job)
