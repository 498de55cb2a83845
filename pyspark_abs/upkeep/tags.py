"""Named savepoints: names for snapshots, which retention keeps and rollback and restore take.

A name is a row in the manifest (TAGGED, and UNTAGGED when it is taken away), appended
compare-and-swap like every transition, so a name given while retention runs either lands
first (and the snapshot is kept) or is refused because the snapshot expired first. Naming
changes no table and needs no lease: a snapshot can be named while its pipeline runs.
"""

from __future__ import annotations

import uuid

from pyspark_abs.errors import ConfigError, SnapshotNotFoundError
from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.manifest.log import EpochLog, is_tag_name
from pyspark_abs.manifest.table import open_root, root_owner
from pyspark_abs.protocol.epoch_writer import EpochWriter, now
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore


def tag(root: str, epoch: int | str, name: str, *, move: bool = False) -> SnapshotInfo:
    """Name the snapshot of ``epoch``: a savepoint that retention never expires.

    Args:
        root: The snapshot root.
        epoch: A COMMITTED or RESTORED epoch, or the name of another savepoint.
        name: The savepoint's name: a letter, then up to 99 letters, digits, ``_``, ``.``
            and ``-``.
        move: If ``name`` already names another snapshot, move it (in one manifest commit)
            instead of refusing.

    Returns:
        The named snapshot, with its names in :attr:`SnapshotInfo.tags`.

    Raises:
        ConfigError: ``name`` is not a valid name, or names another snapshot (without
            ``move``).
        SnapshotNotFoundError: The root, the epoch or the savepoint does not exist, or the
            epoch is not a snapshot.
    """
    check_name(name)
    root = SnapshotRoot(root)
    store = DeltaStore()
    epochs = open_root(store, root)
    target = epochs.require_snapshot(epochs.resolve(epoch, root), root).epoch
    named = epochs.tags().get(name)
    if named == target:
        return _info(epochs, target)
    writer = _writer(store, root, epochs)
    rows = [_row(writer, target, EpochStatus.TAGGED, name)]
    if named is not None:
        if not move:
            raise ConfigError(
                f"savepoint {name!r} of {root} already names epoch {named}; untag it first, "
                f"give another name, or move it (move=True, CLI --move)"
            )
        rows.insert(0, _row(writer, named, EpochStatus.UNTAGGED, name))
    writer.record_all(rows)
    return _info(writer.epochs, target)


def untag(root: str, name: str) -> int:
    """Take a savepoint's name away; return the epoch it named.

    The snapshot stays; retention may expire it once no name keeps it.

    Raises:
        SnapshotNotFoundError: The root does not exist, or no savepoint has that name.
    """
    root = SnapshotRoot(root)
    store = DeltaStore()
    epochs = open_root(store, root)
    named = epochs.resolve(name, root)
    writer = _writer(store, root, epochs)
    writer.record_all([_row(writer, named, EpochStatus.UNTAGGED, name)])
    return named


def check_name(name: object) -> None:
    """Raise unless ``name`` can name a savepoint.

    Raises:
        ConfigError: It cannot, with the rule.
    """
    if not isinstance(name, str) or not is_tag_name(name):
        raise ConfigError(
            f"{name!r} cannot name a savepoint: a name starts with a letter and has up to 100 "
            f"letters, digits, '_', '.' and '-'"
        )


def _writer(store: DeltaStore, root: SnapshotRoot, epochs: EpochLog) -> EpochWriter:
    return EpochWriter(root_owner(store, root), root, store, epochs, f"tag-{uuid.uuid4().hex}")


def _row(writer: EpochWriter, epoch: int, status: EpochStatus, name: str) -> ManifestEntry:
    return ManifestEntry(
        pipeline=writer.pipeline,
        epoch=epoch,
        status=status,
        recorded_at=now(),
        run_id=writer.run_id,
        tag=name,
    )


def _info(epochs: EpochLog, epoch: int) -> SnapshotInfo:
    entry = epochs.latest(epoch)
    if entry is None:  # the epoch was resolved from this log
        raise SnapshotNotFoundError(f"epoch {epoch} is not in the manifest")
    return SnapshotInfo.from_entry(entry, tags=epochs.tags_of(epoch))
