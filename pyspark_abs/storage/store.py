"""Delta Lake access. Every read and write of a Delta table goes through this module.

Writes use delta-rs (``deltalake``), which needs no JVM, and only table features that
delta-spark also reads. Reads into Spark use ``format("delta")`` when Delta is on Spark's
classpath, and otherwise list the files of the wanted version with delta-rs and read them as
Parquet.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.schema import Field, Schema
from deltalake.transaction import AddAction, RemoveAction

from pyspark_abs.errors import (
    CommitError,
    ConcurrentWriteError,
    SnapshotDamagedError,
    SnapshotRootError,
    TableSchemaError,
)
from pyspark_abs.operators.arrow_files import read_parquet
from pyspark_abs.storage.files import FileEntry, damaged, files_after
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.schemas import arrow_schema, schema_differences
from pyspark_abs.storage.transactions import APP_ID_KEY, EPOCH_KEY, epoch_commit

KEEP_LOG = {"delta.enableExpiredLogCleanup": "false"}
"""Table properties that stop Delta from deleting log entries older than
``delta.logRetentionDuration`` (30 days by default) when it writes a checkpoint. The tables
of a snapshot root keep the log of every retained snapshot's version; vacuum removes the
log below the oldest one (see :func:`~pyspark_abs.upkeep.retention.vacuum`). A property, not a
table feature: delta-spark reads such tables and honours it."""


@dataclass(frozen=True)
class TableSpec:
    """A Delta table the pipeline writes.

    Attributes:
        table: Table id, e.g. ``state/word_count``.
        uri: The table's location.
        schema: Its Arrow schema.
        partition_by: Its partition columns.
        description: Description stored in the table's metadata.
    """

    table: str
    uri: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    description: str | None = None


@dataclass(frozen=True)
class CommitResult:
    """The outcome of :meth:`DeltaStore.commit_files`.

    Attributes:
        version: The table's version as of the epoch.
        committed: Whether this call committed the files.
    """

    version: int
    committed: bool


class DeltaStore:
    """Reads and writes the Delta tables of a snapshot root and its sinks."""

    def __init__(self) -> None:
        self._tables: dict[str, DeltaTable] = {}
        self._lock = threading.Lock()
        self._swapped: dict[str, DeltaTable] = {}  # after compare-and-swap appends
        self._swap_lock = threading.Lock()

    def ensure_root(self, root: SnapshotRoot) -> None:
        """Create the snapshot root if needed and check that it is writable.

        Raises:
            SnapshotRootError: The root cannot be created or written.
        """
        probe = f".abs-probe-{uuid.uuid4().hex}"
        try:
            fs, path = pafs.FileSystem.from_uri(root)
            fs.create_dir(path, recursive=True)
            with fs.open_output_stream(f"{path}/{probe}") as out:
                out.write(b"ok")
            fs.delete_file(f"{path}/{probe}")
        except (OSError, pa.ArrowException) as err:
            raise SnapshotRootError(
                f"snapshot root {root} is not writable: {err}. Check the path and its "
                f"permissions, or choose another root"
            ) from None

    def exists(self, uri: str) -> bool:
        """Whether a Delta table exists at ``uri``."""
        return bool(DeltaTable.is_deltatable(uri))

    def ensure_table(self, spec: TableSpec) -> None:
        """Create the table, or check that the existing one has the declared schema.

        Raises:
            TableSchemaError: The existing table's columns or partitioning differ.
            SnapshotRootError: The table cannot be created.
        """
        if not self.exists(spec.uri):
            try:
                DeltaTable.create(
                    spec.uri,
                    spec.schema,
                    mode="ignore",
                    partition_by=list(spec.partition_by) or None,
                    description=spec.description,
                    configuration=dict(KEEP_LOG),
                )
            except (DeltaError, OSError) as err:
                raise SnapshotRootError(
                    f"cannot create table {spec.table} at {spec.uri}: {brief_error(err)}"
                ) from None
            return
        problems = self.schema_problems(spec)
        if problems:
            raise TableSchemaError(
                f"table {spec.table} at {spec.uri} exists with another schema: "
                f"{'; '.join(problems)}. Use a new table location, or declare the table's "
                f"schema"
            )

    def schema_problems(self, spec: TableSpec) -> list[str]:
        """How the existing table at ``spec.uri`` differs from ``spec`` (columns, partitions)."""
        table = self.open(spec.uri)
        problems = schema_differences(spec.schema, arrow_schema(table))
        partitions = tuple(table.metadata().partition_columns)
        if partitions != spec.partition_by:
            problems.append(
                f"partitioned by {list(partitions)}, declared {list(spec.partition_by)}"
            )
        return problems

    def keep_log(self, uri: str) -> bool:
        """Set :data:`KEEP_LOG` on an existing table that lacks it; return whether it did.

        Only for tables the caller alone writes: the property change is a commit that
        concurrent writers see as a metadata change.

        Raises:
            SnapshotRootError: The table cannot be changed.
        """
        table = self.open(uri)
        configuration = table.metadata().configuration
        if all(configuration.get(k) == v for k, v in KEEP_LOG.items()):
            return False
        try:
            table.alter.set_table_properties(dict(KEEP_LOG))
            table.update_incremental()
        except (DeltaError, OSError) as err:
            raise SnapshotRootError(
                f"cannot set {KEEP_LOG} on the table at {uri}: {brief_error(err)}"
            ) from None
        return True

    def properties(self, uri: str) -> dict[str, str]:
        """The table's properties (``delta.*`` settings among them)."""
        return dict(self.open(uri).metadata().configuration)

    def add_missing_columns(self, spec: TableSpec) -> list[str]:
        """Add the columns of ``spec.schema`` that the existing table lacks, as nullable.

        This is how a table written by an older pyspark-abs gets the columns added since;
        existing rows read them as null. Returns the names of the columns added.

        Raises:
            SnapshotRootError: The table cannot be changed.
        """
        table = self.open(spec.uri)
        present = set(arrow_schema(table).names)
        missing = [f for f in spec.schema if f.name not in present]
        if missing:
            try:
                table.alter.add_columns([Field.from_arrow(f.with_nullable(True)) for f in missing])
                table.update_incremental()
            except (DeltaError, OSError) as err:
                raise SnapshotRootError(
                    f"cannot add column(s) {[f.name for f in missing]} to table {spec.table} "
                    f"at {spec.uri}: {brief_error(err)}"
                ) from None
        return [f.name for f in missing]

    def open(self, uri: str) -> DeltaTable:
        """The table at ``uri``, brought up to date (cached per location).

        Raises:
            SnapshotRootError: No Delta table exists there.
            SnapshotDamagedError: The table's Delta log cannot be read.
        """
        with self._lock:
            table = self._tables.get(uri)
            try:
                if table is None:
                    table = self._tables[uri] = DeltaTable(uri)
                else:
                    table.update_incremental()
            except TableNotFoundError:
                raise SnapshotRootError(f"no Delta table at {uri}") from None
            except DeltaError as err:
                raise SnapshotDamagedError(
                    f"the Delta log of the table at {uri} cannot be read: {brief_error(err)}. "
                    f"Run validate on the snapshot root to see which epochs are damaged"
                ) from None
            return table

    def at_version(self, uri: str, version: int) -> DeltaTable:
        """The table at ``uri`` as of ``version`` (delta-rs's errors pass through)."""
        return DeltaTable(uri, version=version)

    def description(self, uri: str) -> str | None:
        """The description stored in a table's metadata."""
        description: str | None = self.open(uri).metadata().description
        return description

    def read(
        self, uri: str, version: int | None = None, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """An unpartitioned table's rows (at ``version``, or the latest; all or ``columns``).

        Files are read with pyarrow's own file systems: scanning through delta-rs's file
        system handler can abort the process at interpreter exit (deltalake 1.6, pyarrow 26).
        """
        table = self.open(uri) if version is None else self.at_version(uri, version)
        schema = arrow_schema(table)
        if columns:
            schema = pa.schema([schema.field(c) for c in columns])
        files = table.file_uris()
        if not files:
            return schema.empty_table()
        return read_parquet(files, schema.names, schema)

    def read_versioned(self, uri: str) -> tuple[pa.Table, int]:
        """An unpartitioned table's latest rows, and the Delta version they were read at.

        Pass the version to :meth:`append` as ``expected_version`` to append only if nobody
        else has committed since.
        """
        table = DeltaTable(uri)
        files = table.file_uris()
        schema = arrow_schema(table)
        rows = read_parquet(files, schema=schema) if files else schema.empty_table()
        return rows, int(table.version())

    def append(self, uri: str, rows: pa.Table, expected_version: int | None = None) -> int:
        """Append rows to a table in one commit and return the new version.

        Args:
            uri: The table.
            rows: The rows to append.
            expected_version: Compare-and-swap: commit only as version
                ``expected_version + 1``, i.e. only if nobody else committed since that
                version was read. The commit is made against the table as of that version
                with no conflict retries, so delta-rs neither rebases it over a concurrent
                commit nor resolves the conflict; of writers racing from one version, one
                wins (put-if-absent of the log entry) and the others fail.

        Raises:
            ConcurrentWriteError: ``expected_version`` is given and another writer
                committed first; nothing was appended.
        """
        if expected_version is None:
            return self._append(self.open(uri), uri, rows, None)
        with self._swap_lock:
            table = self._swapped.pop(uri, None)
            if table is None or table.version() != expected_version:
                try:
                    table = DeltaTable(uri, version=expected_version)
                except DeltaError as err:
                    raise ConcurrentWriteError(
                        f"cannot append to the table at {uri} as of version "
                        f"{expected_version}: {brief_error(err)}"
                    ) from None
            version = self._append(table, uri, rows, expected_version)
            # the next append expects this version: keep the table instead of reloading it
            with contextlib.suppress(DeltaError, OSError):
                table.update_incremental()
                self._swapped[uri] = table
            return version

    @staticmethod
    def _append(table: DeltaTable, uri: str, rows: pa.Table, expected_version: int | None) -> int:
        sink = pa.BufferOutputStream()
        pq.write_table(rows, sink, compression="snappy")
        data = sink.getvalue()
        name = f"part-{uuid.uuid4().hex}.parquet"
        fs, root = pafs.FileSystem.from_uri(uri)
        with fs.open_output_stream(f"{root}/{name}") as out:
            out.write(data)
        stats = json.dumps({"numRecords": rows.num_rows})
        action = AddAction(name, data.size, {}, int(time.time() * 1000), True, stats)
        if expected_version is None:
            table.create_write_transaction([action], mode="append", schema=table.schema())
            table.update_incremental()
            return int(table.version())
        try:
            table.create_write_transaction(
                [action],
                mode="append",
                schema=table.schema(),
                commit_properties=CommitProperties(max_commit_retries=0),
            )
        except CommitFailedError as err:
            with contextlib.suppress(OSError):
                fs.delete_file(f"{root}/{name}")
            raise ConcurrentWriteError(
                f"the table at {uri} changed after version {expected_version} was read; "
                f"nothing was appended ({brief_error(err)})"
            ) from None
        return expected_version + 1

    def commit_files(
        self,
        uri: str,
        files: Mapping[int, Sequence[FileEntry]],
        app_id: str,
        epoch: int,
        *,
        overwrite: bool = False,
        schema: str | None = None,
        root: SnapshotRoot | None = None,
    ) -> CommitResult:
        """Commit pre-written files to the table at ``uri`` as epoch ``epoch``, exactly once.

        ``files`` maps each epoch committed together (``epoch`` and, with a snapshot
        interval, the earlier epochs of its group) to the files it pre-committed. The commit
        carries the application transaction ``(app_id, epoch)``. If the table already holds
        that transaction or a later one, nothing is committed and the version that committed
        ``epoch`` is returned. If it holds an earlier epoch of ``files`` (a crash cut a
        commit sequence short), only the later epochs' files are added (see
        :func:`files_after`). With no files left and no overwrite, nothing is committed and
        the current version is returned. With ``overwrite``, the files replace the table's
        current files, and ``schema`` (a Delta schema as JSON), if given, replaces the table's
        schema: earlier versions keep theirs. ``root``, the committing snapshot root, is
        recorded in the commit's metadata so that errors can name a sink's owner.

        Every file is checked to exist with its recorded size first: a commit never
        references a file that is gone (deleted by hand or by a vacuum that misjudged it).

        Raises:
            CommitError: A file is missing or has another size, the Delta commit failed, or
                the table's transactions say the epoch was committed but its commit cannot
                be found.
        """
        table = self.open(uri)
        done = table.transaction_version(app_id)
        if done is not None and done >= epoch:
            return CommitResult(self._version_of(table, uri, app_id, epoch), committed=False)
        adding = files_after(files, done)
        if not adding and not overwrite:
            return CommitResult(int(table.version()), committed=False)
        self._require_files(uri, adding, epoch)
        now_ms = int(time.time() * 1000)
        actions: list[AddAction | RemoveAction] = [
            AddAction(
                path=f.path,
                size=f.size_bytes,
                partition_values=f.partitions,
                modification_time=now_ms,
                data_change=True,
                stats=f.stats,
            )
            for f in adding
        ]
        try:
            table.create_write_transaction(
                actions,
                mode="overwrite" if overwrite else "append",
                schema=Schema.from_json(schema) if overwrite and schema else table.schema(),
                partition_by=list(table.metadata().partition_columns) or None,
                commit_properties=epoch_commit(app_id, epoch, root),
            )
            table.update_incremental()
        except (DeltaError, OSError) as err:
            raise CommitError(
                f"epoch {epoch}: committing {len(adding)} file(s) to the table at {uri} "
                f"failed: {brief_error(err)}. The epoch stays PREPARED and is committed on restart"
            ) from err
        return CommitResult(int(table.version()), committed=True)

    def _require_files(self, uri: str, files: Sequence[FileEntry], epoch: int) -> None:
        """Refuse to commit files that are missing or not the size they were written with."""
        found = damaged(uri, files)
        if found is not None:
            entry, size = found
            what = "is missing" if size is None else f"has {size} bytes"
            raise CommitError(
                f"epoch {epoch}: file {entry.path} of the table at {uri} {what}, it was "
                f"written with {entry.size_bytes} bytes; nothing was committed to the table. "
                f"The epoch stays PREPARED: put the file back from a backup (pyspark-abs "
                f"validate lists the damage)"
            )

    def restore_version(
        self, uri: str, version: int, app_id: str, epoch: int, root: SnapshotRoot | None = None
    ) -> int:
        """Restore the table at ``uri`` to ``version`` as epoch ``epoch``, exactly once.

        Returns the table's version after the restore (the current version when the table
        already is at ``version`` or holds the epoch's transaction).

        Raises:
            CommitError: The restore failed, e.g. because files of ``version`` were vacuumed.
        """
        table = self.open(uri)
        done = table.transaction_version(app_id)
        if done is not None and done >= epoch:
            return self._version_of(table, uri, app_id, epoch)
        if int(table.version()) == version:
            return version
        try:
            table.restore(version, commit_properties=epoch_commit(app_id, epoch, root))
            table.update_incremental()
        except (DeltaError, OSError) as err:
            raise CommitError(
                f"epoch {epoch}: restoring the table at {uri} to version {version} failed: "
                f"{brief_error(err)}. The epoch stays PREPARED and is retried on the next start or "
                f"rollback"
            ) from err
        return int(table.version())

    def _version_of(self, table: DeltaTable, uri: str, app_id: str, epoch: int) -> int:
        for commit in table.history():
            if commit.get(APP_ID_KEY) == app_id and commit.get(EPOCH_KEY) == str(epoch):
                return int(commit["version"])
        raise CommitError(
            f"the table at {uri} records transaction {app_id!r} at epoch "
            f"{table.transaction_version(app_id)}, but no commit of epoch {epoch}; the table "
            f"was changed outside pyspark-abs. Run validate on the snapshot root"
        )


_BACKTRACE_LINE = re.compile(r"^\s*\d+: ")
_ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")


def brief_error(err: BaseException) -> str:
    """An error's message on one line, without the native backtrace delta-rs appends."""
    parts = []
    for line in _ANSI_CODE.sub("", str(err)).splitlines():
        if _BACKTRACE_LINE.match(line):
            break
        line = line.strip().lstrip("\u21b3").strip()
        if line:
            parts.append(line)
    return ": ".join(parts) or type(err).__name__
