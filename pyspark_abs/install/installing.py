"""Installing a snapshot's tables as a new restore epoch: rollback, restore and write_state."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import (
    OperatorDefinitionError,
    TableSchemaError,
)
from pyspark_abs.faults import FaultInjector, FaultStep
from pyspark_abs.install.file_rewinds import keep_files_read
from pyspark_abs.install.sink_restores import (
    check_sink_restores,
    keeping_other_writers,
    sinks_written_later,
)
from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry, RestorePayload
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import manifest_owner, open_manifest
from pyspark_abs.operators.changelog import latest_per_key
from pyspark_abs.operators.envelope import Kind
from pyspark_abs.operators.keys import key_arrays, repeated
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import DELETED, EPOCH
from pyspark_abs.protocol.epoch_writer import EpochWriter, now
from pyspark_abs.protocol.lease import Lease
from pyspark_abs.protocol.precommit import TableTarget, write_files
from pyspark_abs.snapshots.reading import state_table_description
from pyspark_abs.sources.backedge_log import in_flight
from pyspark_abs.sources.rewind import require_rewindable
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import (
    BACKEDGE_PREFIX,
    STATE_PREFIX,
    SnapshotRoot,
    file_prefix,
    state_table,
)
from pyspark_abs.storage.schemas import arrow_schema, delta_schema_json
from pyspark_abs.storage.store import DeltaStore, TableSpec
from pyspark_abs.upkeep.validation import require_intact


def open_writer(
    store: DeltaStore,
    root: SnapshotRoot,
    pipeline: str | None,
    config: AbsConfig,
    lease: Lease | None = None,
) -> EpochWriter:
    """The writer of a snapshot root (``pipeline`` None: the root must exist).

    Without ``lease`` it refuses to write while a live run holds the root; with it, it
    writes as the holder of that lease.
    """
    if pipeline is None:
        owner = manifest_owner(store, root) if store.exists(root.manifest_uri) else None
        if owner is None:
            raise root.not_found()
        pipeline = owner
    else:
        store.ensure_root(root)
    epochs = open_manifest(store, root, pipeline)
    return EpochWriter(
        pipeline,
        root,
        store,
        epochs,
        run_id=lease.record.run_id if lease is not None else f"restore-{uuid.uuid4().hex}",
        faults=FaultInjector(config.faults),
        lease=lease,
    )


def snapshot_of(epochs: EpochLog, epoch: int | str, root: SnapshotRoot) -> ManifestEntry:
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
    schemas: Mapping[str, str] | None = None,
    job: str | None = None,
    target_root: SnapshotRoot | None = None,
    target_epochs: EpochLog | None = None,
    replacing: str | None = None,
) -> SnapshotInfo:
    """Record PREPARED for a restore epoch, commit it, and return the RESTORED epoch.

    ``target`` is the snapshot the restore epoch continues from (its offsets, watermark
    and counts are kept), or None for a bootstrap. ``schemas`` gives the Delta schema
    (JSON) of the tables whose schema the installed files change (a state migration, or a
    rollback across one). ``job`` names the job root of a job-wide decision.
    ``target_root`` holds ``target`` when it is another root (a restore into a new one),
    and ``target_epochs`` is that root's manifest. With ``replacing`` (why they can never
    be committed), the pending epochs are recorded ABORTED in the same manifest append
    (see :mod:`~pyspark_abs.install.stuck_epochs`).

    Raises:
        SourceError: ``target`` read Spark's file source, and the files it had read cannot
            be resolved.
    """
    keep_files_read(
        writer.store, target, target_root or writer.root, writer.root, epoch, writer.run_id
    )
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
        origin=origin,
        restore=RestorePayload(
            versions=dict(restore_versions),
            schemas=dict(schemas or {}),
            watermark_after_ms=None
            if target is None
            else (target_epochs or writer.epochs).watermark_after(target.epoch),
            job=job,
        ),
    )
    replaced = [
        entry.transition(
            EpochStatus.ABORTED,
            run_id=writer.run_id,
            files=(),
            error=f"replaced by restore epoch {epoch} ({origin}): {replacing}",
        )
        for entry in (writer.epochs.pending() if replacing is not None else ())
    ]
    writer.record_all([*replaced, prepared])
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


@dataclass(frozen=True)
class StateInstall:
    """An operator's whole state, written as files for a restore epoch to install.

    Written before the restore epoch is decided (a job-wide decision records it, so that
    finishing the decision after a crash needs neither the rows nor the code that made them).

    Attributes:
        table: The operator's state table id.
        uri: The state table's location.
        files: The files holding the state, one row per key.
        rows: Keys in the files.
        schema: The state table's Delta schema (JSON) with these files.
        key_groups: The key-group count the rows' ``_key_group`` uses.
        origin: What made the state, for people reading the manifest.
    """

    table: str
    uri: str
    files: tuple[FileEntry, ...]
    rows: int
    schema: str
    key_groups: int
    origin: str

    def to_json(self) -> str:
        """The install as JSON, as a job decision records it."""
        fields = {**self.__dict__, "files": [f.to_dict() for f in self.files]}
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StateInstall:
        """Read :meth:`to_json`'s output."""
        fields = json.loads(text)
        fields["files"] = tuple(FileEntry.from_dict(f) for f in fields["files"])
        return cls(**fields)


def prepare_state(
    store: DeltaStore,
    root: SnapshotRoot,
    plan: OperatorPlan,
    rows: pa.Table,
    epoch: int,
    *,
    action: str,
    origin: str,
    config: AbsConfig,
) -> StateInstall:
    """Write ``rows`` as an operator's whole state, for restore epoch ``epoch`` to install.

    ``rows`` holds the key and state columns, ``_key_group`` and ``_timeout``, one row per
    key. The state table is created if the root has none; the files are invisible until
    the restore epoch commits them.

    Raises:
        TableSchemaError: The state table holds state under other key columns (``action``
            says what was refused).
    """
    table = state_table(plan.name)
    uri = root.table_uri(table)
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
    ).append_column(pa.field(DELETED, pa.bool_()), pa.array([False] * rows.num_rows, pa.bool_()))
    files = write_rows(store, table, uri, installed, epoch, config, schema)
    return StateInstall(
        table,
        uri,
        tuple(files),
        installed.num_rows,
        delta_schema_json(schema),
        config.key_groups,
        origin,
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

    ``rows`` is as :func:`prepare_state` takes it. The state table takes the plan's schema
    (old versions keep theirs); sinks stay as of the newest snapshot, whose versions the
    restore epoch records so that a rollback to it rewinds them too; back-edge records in
    flight there stay in flight.

    Raises:
        SourceError: The newest snapshot was read from a source that cannot be rewound
            (nothing is changed; ``action`` says what was refused).
        TableSchemaError: The state table holds state under other key columns.
    """
    latest = writer.epochs.snapshots()
    previous = latest[-1] if latest else None
    if previous is not None:
        require_rewindable(previous, writer.root, action)
    epoch = next_epoch(writer.epochs)
    state = prepare_state(
        writer.store, writer.root, plan, rows, epoch, action=action, origin=origin, config=config
    )
    if previous is not None:
        return install_snapshot(writer, previous, epoch, config, state=state)
    return install_tables(
        writer,
        None,
        epoch,
        tables={state.table: state.uri},
        files=list(state.files),
        rows={state.table: state.rows},
        restore_versions={},
        origin=state.origin,
        key_groups=state.key_groups,
        state_keys=state.rows,
        schemas={state.table: state.schema},
    )


def install_snapshot(
    writer: EpochWriter,
    target: ManifestEntry,
    restore_epoch: int,
    config: AbsConfig,
    *,
    state: StateInstall | None = None,
    job: str | None = None,
    origin: str | None = None,
    refuse_lost_changes: bool = True,
    replacing: str | None = None,
) -> SnapshotInfo:
    """Record and commit ``restore_epoch``, which installs snapshot ``target`` in the root.

    Each state table gets its live state as of ``target`` (with its schema of then), each
    back-edge log the records in flight in ``target``, and each sink its Delta version of
    ``target`` (or the version before this root first wrote it, for a sink ``target``
    predates), keeping other writers' changes (see :func:`keeping_other_writers`). With
    ``state``, the operator's state is that instead (under its own table and schema).
    ``job`` names the job root of a job-wide decision. A job-wide decision checks the
    sinks before it decides and installs with ``refuse_lost_changes`` False: once decided,
    it is finished. With ``replacing``, the pending epochs, which can never be committed
    for that reason, are recorded ABORTED with the decision.

    Raises:
        ExternalChangeError: Another writer removed rows from a sink since ``target``, and
            the root committed to it since too; nothing was changed.
        SnapshotDamagedError: A sink the root wrote after ``target`` has no version as of
            ``target``.
        CommitError: A table could not be restored; the restore epoch stays PREPARED.
    """
    store = writer.store
    files: list[FileEntry] = []
    rows: dict[str, int] = {}
    schemas: dict[str, str] = {}
    tables = dict(target.tables)
    for table, uri in target.tables.items():
        if state is not None and table.startswith(STATE_PREFIX):
            del tables[table]  # the given state replaces it (also under an earlier name)
            continue
        installed = installed_table(store, table, uri, target)
        if installed is not None:
            # a state table takes its schema as of the target back (a migration since)
            is_state = table.startswith(STATE_PREFIX)
            schema = installed.schema if is_state else None
            files += write_rows(store, table, uri, installed, restore_epoch, config, schema)
            rows[table] = installed.num_rows
            if schema is not None:
                schemas[table] = delta_schema_json(schema)
    if state is not None:
        tables[state.table] = state.uri
        files += state.files
        rows[state.table] = state.rows
        schemas[state.table] = state.schema
    restore_versions = {
        t: v for t, v in target.table_versions.items() if t in tables and t not in rows
    }
    for table, (uri, version) in sinks_written_later(writer.epochs, target).items():
        tables[table] = uri
        restore_versions[table] = version
    if refuse_lost_changes:
        check_sink_restores(writer, target)
    restore_versions = keeping_other_writers(
        store, tables, restore_versions, target.epoch, refuse=refuse_lost_changes
    )
    return install_tables(
        writer,
        target,
        restore_epoch,
        tables=tables,
        files=files,
        rows=rows,
        restore_versions=restore_versions,
        origin=state.origin if state is not None else origin or f"rollback to epoch {target.epoch}",
        key_groups=state.key_groups if state is not None else None,
        state_keys=state.rows if state is not None else None,
        schemas=schemas,
        job=job,
        replacing=replacing,
    )
