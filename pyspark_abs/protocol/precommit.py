"""Pre-commit, phase 1 of the two-phase commit, run in Spark tasks.

A narrow pass over each partition of the envelope stream decodes the payloads, writes them as
Parquet files straight into the target tables' directories, and yields one barrier marker
listing those files. The files are invisible until the coordinator commits them to the Delta
log, so a failed or retried task leaves only orphans that no marker lists.
"""

from __future__ import annotations

import datetime as dt
import json
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pyspark_abs.errors import StorageError
from pyspark_abs.faults import Fault, FaultAction, crash_or_raise, task_fault
from pyspark_abs.operators.envelope import Kind
from pyspark_abs.operators.schema import DELETED, EPOCH, KEY_GROUP
from pyspark_abs.operators.state_codec import BatchCodec
from pyspark_abs.protocol.barrier import BarrierMarker
from pyspark_abs.runtime import settle_worker_heap
from pyspark_abs.storage.files import FileEntry
from pyspark_abs.storage.root import file_epoch, file_prefix

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
_ESCAPED = set("\"#%'*/:=?\\{[]^\x7f") | {chr(c) for c in range(0x20)}
_FLUSH_ROWS = 256 * 1024
_STATS_TYPES = (pa.types.is_integer, pa.types.is_date32, pa.types.is_string)
_MAX_STAT_CHARS = 64


@dataclass(frozen=True)
class TableTarget:
    """A table an envelope row can be written to.

    Attributes:
        table: Table id, e.g. ``state/word_count`` or ``sink/output``.
        uri: The table's root.
        kind: Which envelope rows go here.
        index: For outputs, the output's index.
        payload_schema: Schema of the envelope payloads.
        table_schema: Schema of the table. For state tables it adds ``_key_group`` and
            ``_epoch``, which the pre-commit task stamps on every row.
        partition_by: Hive partition columns of the table.
    """

    table: str
    uri: str
    kind: Kind
    index: int
    payload_schema: pa.Schema
    table_schema: pa.Schema
    partition_by: tuple[str, ...] = ()

    @property
    def stamped(self) -> bool:
        """Whether rows get ``_key_group`` and ``_epoch`` stamped on (state tables)."""
        return self.kind is Kind.STATE


@dataclass(frozen=True)
class PrecommitPlan:
    """What every pre-commit task of one epoch needs.

    Attributes:
        operator: The operator's name.
        epoch: The epoch being pre-committed.
        targets: Tables to write to.
        target_file_bytes: Roll over to a new file past this size.
        faults: Faults to inject in tasks.
        root_tag: The snapshot root's tag
            (:attr:`~pyspark_abs.storage.root.SnapshotRoot.tag`), put in every file name.
    """

    operator: str
    epoch: int
    targets: tuple[TableTarget, ...]
    target_file_bytes: int
    faults: tuple[Fault, ...] = ()
    root_tag: str = ""


class PrecommitTask:
    """The function given to ``mapInArrow``: write one partition, yield its marker."""

    def __init__(self, plan: PrecommitPlan) -> None:
        self.plan = plan

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Write the partition's envelope rows and yield exactly one barrier marker."""
        from pyspark import TaskContext

        settle_worker_heap()
        context = TaskContext.get()
        partition = context.partitionId() if context else 0
        attempt = context.attemptNumber() if context else 0
        marker = write_partition(self.plan, batches, partition, attempt)
        fault = task_fault(self.plan.faults, self.plan.epoch, partition, attempt)
        if fault is not None:
            crash_or_raise(fault, f"pre-commit of epoch {self.plan.epoch}, partition {partition}")
            if fault.action is FaultAction.DROP_MARKER:
                return
            _damage(self.plan, marker, fault.action)
        yield marker.to_batch()


def write_partition(
    plan: PrecommitPlan, batches: Iterator[pa.RecordBatch], partition: int, attempt: int
) -> BarrierMarker:
    """Write one partition's envelope rows to Parquet files and describe them in a marker."""
    targets = {(t.kind, t.index): t for t in plan.targets}
    codecs = {
        key: BatchCodec(t.payload_schema, f"payload for {t.table}") for key, t in targets.items()
    }
    prefix = file_prefix(plan.epoch, f"p{partition:05d}-a{attempt}", plan.root_tag)
    writers: dict[tuple[Kind, int], _TableWriter] = {}
    keys_delta = 0
    busy = 0.0  # time spent writing, not waiting for the operator upstream
    for batch in batches:
        started = time.perf_counter()
        columns = batch.to_pydict()
        for kind, index, key_group, delta, payload in zip(
            columns["kind"],
            columns["target"],
            columns["key_group"],
            columns["keys_delta"],
            columns["payload"],
            strict=True,
        ):
            key = (Kind(kind), index)
            target = targets[key]
            table = codecs[key].decode(payload)
            if target.stamped:
                keys_delta += delta
                rows = table.num_rows
                table = (
                    table.append_column(KEY_GROUP, pa.array(np.full(rows, key_group, np.int32)))
                    .append_column(EPOCH, pa.array(np.full(rows, plan.epoch, np.int64)))
                    .select(target.table_schema.names)
                )
            writer = writers.get(key)
            if writer is None:
                writer = writers[key] = _TableWriter(target, prefix, plan.target_file_bytes)
            writer.add(table)
        busy += time.perf_counter() - started
    started = time.perf_counter()
    files: list[FileEntry] = []
    for writer in writers.values():
        files.extend(writer.close())
    busy += time.perf_counter() - started
    return BarrierMarker(
        operator=plan.operator,
        epoch=plan.epoch,
        partition=partition,
        attempt=attempt,
        keys_delta=keys_delta,
        precommit_ms=busy * 1000,
        acked_at_ms=time.time() * 1000,
        files=tuple(files),
    )


def write_files(
    target: TableTarget, rows: pa.Table, prefix: str, target_bytes: int
) -> list[FileEntry]:
    """Write rows of ``target``'s table schema as Parquet files not yet in its Delta log.

    The driver-side counterpart of a pre-commit task, for restore epochs and compaction.
    """
    writer = _TableWriter(target, prefix, target_bytes)
    if rows.num_rows:
        writer.add(rows.select(target.table_schema.names).cast(target.table_schema))
    return writer.close()


class _TableWriter:
    """Buffers one table's rows of a partition and writes them as rolling Parquet files."""

    def __init__(self, target: TableTarget, prefix: str, target_bytes: int) -> None:
        self.target = target
        self.prefix = prefix
        self.target_bytes = target_bytes
        self.fs, self.root = pafs.FileSystem.from_uri(target.uri)
        self.pending: list[pa.Table] = []
        self.pending_rows = 0
        self.open: dict[str, _OpenFile] = {}
        self.done: list[FileEntry] = []
        self.sequence = 0

    def add(self, table: pa.Table) -> None:
        self.pending.append(table)
        self.pending_rows += table.num_rows
        if self.pending_rows >= _FLUSH_ROWS:
            self._flush()

    def close(self) -> list[FileEntry]:
        self._flush()
        for directory in list(self.open):
            self._finish(directory)
        return self.done

    def _flush(self) -> None:
        if not self.pending:
            return
        table = pa.concat_tables(self.pending)
        self.pending, self.pending_rows = [], 0
        for values, part in _split_partitions(table, self.target.partition_by):
            directory = _partition_dir(values)
            current = self.open.get(directory)
            if current is None:
                current = self.open[directory] = _OpenFile(part.schema, values)
            current.writer.write_table(part)
            if current.sink.tell() >= self.target_bytes:
                self._finish(directory)

    def _finish(self, directory: str) -> None:
        current = self.open.pop(directory)
        current.writer.close()
        data = current.sink.getvalue()
        name = f"{self.prefix}-{self.sequence:03d}.parquet"
        self.sequence += 1
        relative = f"{directory}{name}"
        target_dir = f"{self.root}/{directory}".rstrip("/")
        try:
            self.fs.create_dir(target_dir, recursive=True)
            with self.fs.open_output_stream(f"{self.root}/{relative}") as out:
                out.write(data)
        except OSError as err:
            epoch = file_epoch(name)
            raise StorageError(
                f"{'' if epoch is None else f'epoch {epoch}: '}cannot write file {relative} "
                f"({data.size} bytes) of table {self.target.table} at {self.target.uri}: "
                f"{err}. Free space on that storage or make it writable; nothing of the "
                f"epoch is committed, and restarting the pipeline replays it"
            ) from None
        metadata = pq.read_metadata(pa.BufferReader(data))
        self.done.append(
            FileEntry(
                table=self.target.table,
                path=relative,
                size_bytes=data.size,
                num_rows=metadata.num_rows,
                crc32=zlib.crc32(memoryview(data)),
                partition_values=json.dumps(current.values, sort_keys=True),
                stats=delta_stats(metadata),
            )
        )


class _OpenFile:
    def __init__(self, schema: pa.Schema, values: dict[str, str | None]) -> None:
        self.sink = pa.BufferOutputStream()
        dictionary: Any = dictionary_columns(schema)  # pyarrow takes a list; its stubs say bool
        self.writer = pq.ParquetWriter(
            self.sink, schema, compression="snappy", use_dictionary=dictionary
        )
        self.values = values


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """Columns worth dictionary-encoding: text, flags and pyspark-abs's stamps.

    Dictionary-encoding high-cardinality numbers (keys, counts) doubles the write time and
    saves nothing, so numeric user columns are written plain.
    """
    stamps = {KEY_GROUP, EPOCH, DELETED}
    return [
        f.name
        for f in schema
        if f.name in stamps
        or pa.types.is_string(f.type)
        or pa.types.is_large_string(f.type)
        or pa.types.is_boolean(f.type)
    ]


def _split_partitions(
    table: pa.Table, partition_by: Sequence[str]
) -> Iterator[tuple[dict[str, str | None], pa.Table]]:
    """Split rows by their partition values; partition columns are not stored in files."""
    if not partition_by:
        yield {}, table
        return
    combos = table.select(list(partition_by)).group_by(list(partition_by)).aggregate([])
    data = table.drop_columns(list(partition_by))
    for combo in combos.to_pylist():
        mask = np.ones(table.num_rows, dtype=bool)
        for column in partition_by:
            value = combo[column]
            values: Any = table[column]
            test = pc.is_null(values) if value is None else pc.equal(values, value)
            mask &= np.asarray(pc.fill_null(test, False))
        yield {c: partition_value(combo[c]) for c in partition_by}, data.filter(mask)


def partition_value(value: Any) -> str | None:
    """The Delta/Hive string form of a partition value."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.date):
        return value.isoformat()
    return str(value)


def _partition_dir(values: dict[str, str | None]) -> str:
    return "".join(
        f"{column}={NULL_PARTITION if value is None else _escape(value)}/"
        for column, value in values.items()
    )


def _escape(value: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


def delta_stats(metadata: pq.FileMetaData) -> str:
    """Delta add-action statistics from a Parquet footer.

    Row counts and null counts always; min and max only for integer, date and short string
    columns where every row group with values has statistics (Arrow's Parquet writer never
    truncates them), so data skipping can never drop a row.
    """
    nulls: dict[str, int] = {}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    # Footer statistics are per leaf column; nested fields have several leaves, so a
    # top-level field's position is not its leaf index.
    leaves = {metadata.schema.column(j).path: j for j in range(metadata.num_columns)}
    for field in metadata.schema.to_arrow_schema():
        if pa.types.is_nested(field.type) or field.name not in leaves:
            continue
        leaf = leaves[field.name]
        found = [
            metadata.row_group(rg).column(leaf).statistics for rg in range(metadata.num_row_groups)
        ]
        column_stats: list[Any] = [s for s in found if s is not None and s.null_count is not None]
        if not column_stats or len(column_stats) != len(found):
            continue
        nulls[field.name] = sum(int(s.null_count) for s in column_stats)
        if not any(check(field.type) for check in _STATS_TYPES):
            continue
        valued = [s for s in column_stats if s.num_values > 0]
        if not valued or not all(s.has_min_max for s in valued):
            continue
        low, high = min(s.min for s in valued), max(s.max for s in valued)
        if pa.types.is_string(field.type) and max(len(low), len(high)) > _MAX_STAT_CHARS:
            continue
        mins[field.name] = low.isoformat() if isinstance(low, dt.date) else low
        maxs[field.name] = high.isoformat() if isinstance(high, dt.date) else high
    stats = {
        "numRecords": metadata.num_rows,
        "minValues": mins,
        "maxValues": maxs,
        "nullCount": nulls,
    }
    return json.dumps(stats)


def _damage(plan: PrecommitPlan, marker: BarrierMarker, action: FaultAction) -> None:
    """Delete or truncate the first file of a marker (fault injection)."""
    if not marker.files:
        return
    first = marker.files[0]
    target = next(t for t in plan.targets if t.table == first.table)
    fs, root = pafs.FileSystem.from_uri(target.uri)
    path = f"{root}/{first.path}"
    if action is FaultAction.DELETE_FILE:
        fs.delete_file(path)
    else:
        with fs.open_input_stream(path) as source:
            head = source.read(max(0, first.size_bytes // 2))
        with fs.open_output_stream(path) as out:
            out.write(head)
