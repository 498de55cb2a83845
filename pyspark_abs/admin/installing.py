"""Installing a snapshot's tables as a new restore epoch: rollback, restore and write_state."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from pyspark_abs.admin.validation import require_intact
from pyspark_abs.config import AbsConfig
from pyspark_abs.faults import FaultInjector, FaultStep
from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import manifest_owner, open_manifest
from pyspark_abs.operators.changelog import latest_per_key
from pyspark_abs.operators.envelope import Kind
from pyspark_abs.protocol.epoch_writer import EpochWriter, now
from pyspark_abs.protocol.precommit import TableTarget, file_prefix, write_files
from pyspark_abs.sources.backedge_log import in_flight
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import BACKEDGE_PREFIX, STATE_PREFIX, SnapshotRoot
from pyspark_abs.storage.schemas import arrow_schema
from pyspark_abs.storage.store import DeltaStore


def open_writer(
    store: DeltaStore, root: str, pipeline: str | None, config: AbsConfig
) -> EpochWriter:
    """The writer of a snapshot root (``pipeline`` None: the root must exist)."""
    if pipeline is None:
        owner = (
            manifest_owner(store, root) if store.exists(SnapshotRoot(root).manifest_uri) else None
        )
        if owner is None:
            raise SnapshotRoot(root).not_found()
        pipeline = owner
    else:
        store.ensure_root(root)
    epochs = open_manifest(store, root, pipeline)
    return EpochWriter(
        pipeline,
        root,
        store,
        epochs,
        run_id=f"restore-{uuid.uuid4().hex}",
        faults=FaultInjector(config.faults),
    )


def snapshot_of(epochs: EpochLog, epoch: int | str, root: str) -> ManifestEntry:
    """The entry of an epoch, or of a savepoint's name, which must be a readable snapshot."""
    entry = epochs.require_snapshot(epochs.resolve(epoch, root), root)
    require_intact(root, epochs, entry.epoch, "It cannot be restored.")
    return entry


def shown(epoch: int | str) -> str:
    """An epoch or a savepoint, as messages name what the user asked for."""
    return f"savepoint {epoch!r}" if isinstance(epoch, str) else f"epoch {epoch}"


def next_epoch(epochs: EpochLog) -> int:
    """The epoch after every epoch of the log."""
    return max((e.epoch for e in epochs.entries), default=-1) + 1


def installed_table(
    store: DeltaStore, table: str, uri: str, target: ManifestEntry
) -> pa.Table | None:
    """What a restore epoch installs in a table of ``target``, or None to restore a sink.

    A state table gets the live state as of ``target``; a back-edge log gets the records
    in flight in ``target``.
    """
    if table.startswith(BACKEDGE_PREFIX):
        return in_flight(store, target, table[len(BACKEDGE_PREFIX) :])
    if not table.startswith(STATE_PREFIX):
        return None
    meta = json.loads(store.description(uri) or "{}")
    changes = store.read(uri, target.table_versions[table])
    return latest_per_key(changes, meta["key"], target.epoch)


def write_rows(
    store: DeltaStore, table: str, uri: str, rows: pa.Table, epoch: int, config: AbsConfig
) -> list[FileEntry]:
    """Write ``rows`` as the files a restore epoch commits to one table."""
    schema = arrow_schema(store.open(uri))
    kind = Kind.STATE if table.startswith(STATE_PREFIX) else Kind.OUTPUT
    target = TableTarget(table, uri, kind, 0, schema, schema)
    return write_files(target, rows, file_prefix(epoch, "restore"), config.target_file_bytes)


def install_tables(
    writer: EpochWriter,
    target: ManifestEntry | None,
    epoch: int,
    *,
    tables: Mapping[str, str],
    files: list[FileEntry],
    rows: Mapping[str, int],
    restore_versions: Mapping[str, int],
    origin: str,
    key_groups: int | None = None,
    state_keys: int | None = None,
) -> SnapshotInfo:
    """Record PREPARED for a restore epoch, commit it, and return the RESTORED epoch.

    ``target`` is the snapshot the restore epoch continues from (its offsets, watermark
    and counts are kept), or None for a bootstrap.
    """
    prepared = ManifestEntry(
        pipeline=writer.pipeline,
        epoch=epoch,
        status=EpochStatus.PREPARED,
        recorded_at=now(),
        run_id=writer.run_id,
        key_groups=key_groups if key_groups is not None else _of(target, "key_groups"),
        num_partitions=_of(target, "num_partitions"),
        tables=dict(tables),
        files=tuple(files),
        rows=dict(rows),
        bytes={t: sum(f.size_bytes for f in files if f.table == t) for t in tables},
        state_keys=state_keys if state_keys is not None else _of(target, "state_keys"),
        source_offsets=_of(target, "source_offsets"),
        watermark_ms=_of(target, "watermark_ms"),
        restored_from=_of(target, "epoch"),
        restore_versions=dict(restore_versions),
        origin=origin,
    )
    writer.record(prepared)
    writer.faults.at(FaultStep.AFTER_PREPARED, epoch)
    return SnapshotInfo.from_entry(writer.commit([prepared]))


def _of(entry: ManifestEntry | None, name: str) -> Any:
    return getattr(entry, name) if entry is not None else None
