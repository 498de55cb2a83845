"""Which snapshots a sink's Kafka publisher still owes its topic.

A sink's Delta table is the outbox of its topic: every COMMITTED snapshot appended its rows
in one Delta version, and the publisher sends those rows in one Kafka transaction together
with a marker naming the snapshot, so the marker says exactly what the topic holds. A
snapshot that a later restore epoch rolled back before it was published is never sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import astuple, dataclass

from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry


@dataclass(frozen=True)
class Publication:
    """A snapshot's commit of a sink table: the rows one Kafka transaction publishes.

    Attributes:
        epoch: The snapshot (the last epoch of its group).
        version: The sink table's Delta version that appended the snapshot's rows.
    """

    epoch: int
    version: int


def unpublished(
    entries: Iterable[ManifestEntry], table: str, published: Publication | None
) -> list[Publication]:
    """The snapshots of ``table`` after ``published``, oldest first.

    Left out are snapshots that a later restore epoch rolled back (those after the epoch it
    restored, before the restore itself) and snapshots that appended nothing to the table
    (their version is the one before).
    """
    committed: dict[int, int] = {}
    restores: dict[int, tuple[int, int]] = {}
    for entry in entries:
        if entry.status is EpochStatus.COMMITTED and table in entry.table_versions:
            committed[entry.epoch] = entry.table_versions[table]
        elif entry.status is EpochStatus.RESTORED and entry.restored_from is not None:
            version = entry.table_versions.get(table, -1)
            restores[entry.epoch] = (entry.restored_from, version)
    rolled_back = {e for e in committed for r, (start, _) in restores.items() if start < e < r}
    last_epoch, last_version = (-1, -1) if published is None else astuple(published)
    owed = []
    for epoch in sorted({*committed, *restores}):
        if epoch in restores:  # its version is the restore's commit, never rows to publish
            last_version = max(last_version, restores[epoch][1])
            continue
        version = committed[epoch]
        if epoch > last_epoch and version > last_version and epoch not in rolled_back:
            owed.append(Publication(epoch, version))
        last_version = max(last_version, version)
    return owed
