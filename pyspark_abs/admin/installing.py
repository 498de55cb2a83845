"""Installing a snapshot's tables as a new restore epoch: rollback, restore and write_state."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from pyspark_abs.admin.validation import require_intact
from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import OperatorDefinitionError, TableSchemaError
from pyspark_abs.faults import FaultInjector, FaultStep
from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import manifest_owner, open_manifest
from pyspark_abs.operators.changelog import latest_per_key
from pyspark_abs.operators.envelope import Kind
from pyspark_abs.operators.keys import key_arrays, repeated
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import DELETED, EPOCH
from pyspark_abs.protocol.epoch_writer import EpochWriter, now
from pyspark_abs.protocol.precommit import TableTarget, file_prefix, write_files
from pyspark_abs.snapshots.reading import state_table_description
from pyspark_abs.sources.backedge_log import in_flight
from pyspark_abs.sources.rewind import require_rewindable
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import BACKEDGE_PREFIX, STATE_PREFIX, SnapshotRoot, state_table
from pyspark_abs.storage.schemas import arrow_schema, delta_schema_json
from pyspark_abs.storage.store import DeltaStore, TableSpec


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
    store: DeltaStore,
    table: str,
    uri: str,
    rows: pa.Table,
    epoch: int,
    config: AbsConfig,
    schema: pa.Schema | None = None,
) -> list[FileEntry]:
    """Write ``rows`` as the files a restore epoch commits to one table.

    ``schema`` is the table's schema after the restore epoch (default: its current one);
    record it with :func:`install_tables`'s ``schemas``.
    """
    schema = schema if schema is not None else arrow_schema(store.open(uri))
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
    schemas: Mapping[str, pa.Schema] | None = None,
) -> SnapshotInfo:
    """Record PREPARED for a restore epoch, commit it, and return the RESTORED epoch.

    ``target`` is the snapshot the restore epoch continues from (its offsets, watermark
    and counts are kept), or None for a bootstrap. ``schemas`` gives the tables whose
    schema the installed files change (a state migration, or a rollback across one).
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
        table_schemas={t: delta_schema_json(s) for t, s in (schemas or {}).items()},
    )
    writer.record(prepared)
    writer.faults.at(FaultStep.AFTER_PREPARED, epoch)
    return SnapshotInfo.from_entry(writer.commit([prepared]))


def _of(entry: ManifestEntry | None, name: str) -> Any:
    return getattr(entry, name) if entry is not None else None


def require_one_row_per_key(rows: pa.Table, keys: Sequence[str], what: str) -> None:
    """Refuse state rows that hold a key more than once.

    Raises:
        OperatorDefinitionError: A key occurs more than once; a few are named.
    """
    (codes,) = key_arrays([rows], keys)
    doubled = repeated(codes)
    if doubled.any():
        sample = rows.filter(pa.array(doubled)).select(list(keys)).slice(0, 5)
        raise OperatorDefinitionError(
            f"{what} has {int(doubled.sum())} rows whose key occurs more than once, e.g. "
            f"{sample.to_pylist()}; keep one row per key"
        )


def install_state(
    writer: EpochWriter,
    plan: OperatorPlan,
    rows: pa.Table,
    *,
    action: str,
    origin: str,
    config: AbsConfig,
) -> SnapshotInfo:
    """Install ``rows`` as an operator's whole state, in a restore epoch after the newest one.

    ``rows`` holds the key and state columns, ``_key_group`` and ``_timeout``, one row per
    key. The state table takes the plan's schema (old versions keep theirs); sinks stay as
    of the newest snapshot, whose versions the restore epoch records so that a rollback to
    it rewinds them too; back-edge records in flight there stay in flight.

    Raises:
        SourceError: The newest snapshot was read from a source that cannot be rewound
            (nothing is changed; ``action`` says what was refused).
        TableSchemaError: The state table holds state under other key columns.
    """
    store, root = writer.store, writer.root
    latest = writer.epochs.snapshots()
    previous = latest[-1] if latest else None
    if previous is not None:
        require_rewindable(previous, root, action)
    epoch = next_epoch(writer.epochs)
    table = state_table(plan.name)
    uri = SnapshotRoot(root).table_uri(table)
    schema = plan.state_table_schema
    if store.exists(uri):
        keys = json.loads(store.description(uri) or "{}").get("key")
        if keys != list(plan.key_columns):
            raise TableSchemaError(
                f"cannot {action}: the state table at {uri} holds state keyed by {keys}, the "
                f"operator is keyed by {list(plan.key_columns)}; use a new snapshot root"
            )
    else:
        store.ensure_table(TableSpec(table, uri, schema, (), state_table_description(plan)))
    installed = rows.append_column(
        pa.field(EPOCH, pa.int64()), pa.array([epoch] * rows.num_rows, pa.int64())
    ).append_column(pa.field(DELETED, pa.bool_()), pa.array([False] * rows.num_rows))
    files = write_rows(store, table, uri, installed, epoch, config, schema)
    tables, counts = {table: uri}, {table: installed.num_rows}
    sinks: dict[str, int] = {}
    for other, other_uri in (previous.tables if previous is not None else {}).items():
        if other.startswith(BACKEDGE_PREFIX):
            # Records in flight on back-edges stay in flight: the next run replays them.
            assert previous is not None
            records = installed_table(store, other, other_uri, previous)
            assert records is not None
            files += write_rows(store, other, other_uri, records, epoch, config)
            tables[other], counts[other] = other_uri, records.num_rows
        elif (
            previous is not None
            and other in previous.table_versions
            and not other.startswith(STATE_PREFIX)
        ):
            tables[other], sinks[other] = other_uri, previous.table_versions[other]
    return install_tables(
        writer,
        previous,
        epoch,
        tables=tables,
        files=files,
        rows=counts,
        restore_versions=sinks,
        origin=origin,
        key_groups=config.key_groups,
        state_keys=installed.num_rows,
        schemas={table: schema},
    )
