"""Reading snapshots: the epochs of a snapshot root, and state and sinks as of an epoch.

The state table of an operator is a changelog: one row per key and epoch in which the key's
state changed, with ``_deleted`` marking removals. The state as of epoch e is the latest row
per key among those with ``_epoch <= e``, without tombstones, read at the table version that
the manifest records for e.
"""

from __future__ import annotations

import builtins
import json
from typing import TYPE_CHECKING

import pyarrow as pa

from pyspark_abs.errors import ConfigError, SnapshotNotFoundError
from pyspark_abs.manifest.entries import EpochStatus, ManifestEntry
from pyspark_abs.manifest.info import SnapshotInfo
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.manifest.table import load_epoch_log, manifest_owner
from pyspark_abs.operators.changelog import latest_per_key
from pyspark_abs.operators.schema import DELETED, EPOCH, KEY_GROUP, RESERVED_COLUMNS, TIMEOUT
from pyspark_abs.snapshots.metrics import metrics_table
from pyspark_abs.sources.backedge_log import in_flight, in_flight_count
from pyspark_abs.storage.root import (
    BACKEDGE_PREFIX,
    SINK_PREFIX,
    STATE_PREFIX,
    SnapshotRoot,
    backedge_table,
    sink_table,
    state_table,
)
from pyspark_abs.storage.schemas import arrow_schema
from pyspark_abs.storage.spark import load_dataframe
from pyspark_abs.storage.store import DeltaStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pyspark_abs.operators.plan import OperatorPlan


def state_table_description(plan: OperatorPlan) -> str:
    """The description stored in an operator's state table: its operator and key columns.

    The state columns are those of the table's schema at each version.
    """
    return json.dumps({"operator": plan.name, "key": list(plan.key_columns)})


class Snapshots:
    """Read access to the snapshots under a snapshot root.

    Listing needs no Spark; reading state and sinks as DataFrames needs a SparkSession
    (Delta's JVM jars are used when present, but are not needed).
    """

    def __init__(self, root: str, spark: SparkSession | None = None) -> None:
        """Open a snapshot root for reading.

        Raises:
            SnapshotNotFoundError: There is no manifest under ``root``.
        """
        self.root = SnapshotRoot(root)
        self.spark = spark
        self._store = DeltaStore()
        if not self._store.exists(self.root.manifest_uri):
            raise self.root.not_found()

    @property
    def pipeline(self) -> str | None:
        """The pipeline the root belongs to."""
        return manifest_owner(self._store, self.root)

    def list(self, *, include_aborted: bool = False) -> builtins.list[SnapshotInfo]:
        """Every epoch with its latest status, oldest first.

        Args:
            include_aborted: Also list epochs whose last attempt was aborted.
        """
        log = self._log()
        infos = []
        for entry in log.entries:
            latest = log.latest(entry.epoch)
            if latest is not entry:
                continue
            if entry.status is EpochStatus.ABORTED and not include_aborted:
                continue
            infos.append(SnapshotInfo.from_entry(entry, log.tags_of(entry.epoch)))
        return sorted(infos, key=lambda i: i.epoch)

    def get(self, epoch: int | str) -> SnapshotInfo:
        """One epoch, by number or by the name of its savepoint.

        Raises:
            SnapshotNotFoundError: The epoch is not in the manifest, or no savepoint has
                that name.
        """
        log = self._log()
        number = log.resolve(epoch, self.root)
        entry = log.latest(number)
        if entry is None:
            raise SnapshotNotFoundError(f"epoch {epoch} is not in snapshot root {self.root}")
        return SnapshotInfo.from_entry(entry, log.tags_of(number))

    def latest(self) -> SnapshotInfo | None:
        """The newest readable (COMMITTED or RESTORED) epoch, or None."""
        log = self._log()
        snapshots = log.snapshots()
        if not snapshots:
            return None
        return SnapshotInfo.from_entry(snapshots[-1], log.tags_of(snapshots[-1].epoch))

    def tags(self) -> dict[str, int]:
        """Named savepoints: each name and the epoch it names (see :func:`~pyspark_abs.tag`)."""
        return self._log().tags()

    def operators(self) -> builtins.list[str]:
        """Names of the operators whose state the root holds."""
        return sorted(t.split("/", 1)[1] for t in self._tables() if t.startswith(STATE_PREFIX))

    def sinks(self) -> builtins.list[str]:
        """Names of the outputs committed to sinks."""
        return sorted(t.split("/", 1)[1] for t in self._tables() if t.startswith(SINK_PREFIX))

    def back_edges(self) -> builtins.list[str]:
        """Ids of the back-edges whose logs the root holds."""
        return sorted(
            t[len(BACKEDGE_PREFIX) :] for t in self._tables() if t.startswith(BACKEDGE_PREFIX)
        )

    def metrics(self, *, include_aborted: bool = False) -> DataFrame:
        """Per-epoch snapshot metrics as a DataFrame, for SQL and plots.

        One row per epoch with the columns of :data:`~pyspark_abs.snapshots.metrics.METRICS_SCHEMA`.

        Args:
            include_aborted: Also return epochs whose last attempt was aborted.
        """
        return self._spark().createDataFrame(self.metrics_table(include_aborted=include_aborted))

    def metrics_table(self, *, include_aborted: bool = False) -> pa.Table:
        """:meth:`metrics` as an Arrow table, without Spark."""
        return metrics_table(self.list(include_aborted=include_aborted))

    def in_flight(self, edge: str, epoch: int | str | None = None) -> DataFrame:
        """The records in flight on a back-edge in a snapshot: produced, not yet consumed.

        A pipeline restored from the snapshot replays exactly these records.

        Raises:
            SnapshotNotFoundError: The back-edge or epoch is unknown or not committed.
        """
        return self._spark().createDataFrame(self.in_flight_table(edge, epoch))

    def in_flight_table(self, edge: str, epoch: int | str | None = None) -> pa.Table:
        """:meth:`in_flight` as an Arrow table, without Spark."""
        entry = self._committed(epoch, backedge_table(edge), f"back-edge {edge!r}")
        return in_flight(self._store, entry, edge)

    def in_flight_count(self, edge: str, epoch: int | str | None = None) -> int:
        """How many records :meth:`in_flight` holds, without reading them."""
        entry = self._committed(epoch, backedge_table(edge), f"back-edge {edge!r}")
        return in_flight_count(self._store, entry, edge)

    def manifest(self) -> DataFrame:
        """The ``_manifest`` table as a DataFrame, one row per epoch transition."""
        spark = self._spark()
        uri = self.root.manifest_uri
        return load_dataframe(spark, uri, int(self._store.open(uri).version()))

    def state(
        self, operator: str, epoch: int | str | None = None, *, with_metadata: bool = False
    ) -> DataFrame:
        """An operator's state as of a committed epoch, one row per live key.

        Args:
            operator: The operator's name.
            epoch: A COMMITTED or RESTORED epoch, or a savepoint's name; None for the
                newest.
            with_metadata: Also return ``_key_group``, ``_epoch`` (the epoch of the key's
                last change) and ``_timeout``.

        Raises:
            SnapshotNotFoundError: The operator or epoch is unknown or not a snapshot (not
                committed yet, expired, or MERGED into a later snapshot).
        """
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        entry, uri, keys, values = self._state_table(operator, epoch)
        changes = load_dataframe(self._spark(), uri, entry.table_versions[state_table(operator)])
        latest = Window.partitionBy(*keys).orderBy(F.col(EPOCH).desc())
        state = (
            changes.where(F.col(EPOCH) <= entry.epoch)
            .withColumn("_abs_rank", F.row_number().over(latest))
            .where((F.col("_abs_rank") == 1) & ~F.col(DELETED))
        )
        columns = [*keys, *values]
        if with_metadata:
            columns += [KEY_GROUP, EPOCH, TIMEOUT]
        return state.select(*columns)

    def state_table(self, operator: str, epoch: int | str | None = None) -> pa.Table:
        """An operator's state as of a committed epoch as an Arrow table, without Spark.

        Columns are the key and state columns, then ``_key_group``, ``_epoch`` (the epoch
        of the key's last change) and ``_timeout``.

        Raises:
            SnapshotNotFoundError: The operator or epoch is unknown or not a snapshot (not
                committed yet, expired, or MERGED into a later snapshot).
        """
        entry, uri, keys, values = self._state_table(operator, epoch)
        changes = self._store.read(uri, entry.table_versions[state_table(operator)])
        live = latest_per_key(changes, keys, entry.epoch)
        return live.select([*keys, *values, KEY_GROUP, EPOCH, TIMEOUT])

    def _state_table(
        self, operator: str, epoch: int | str | None
    ) -> tuple[ManifestEntry, str, builtins.list[str], builtins.list[str]]:
        """The epoch's entry, the state table's location, its key and state columns."""
        table = state_table(operator)
        entry = self._committed(epoch, table, f"operator {operator!r}")
        uri = entry.tables[table]
        keys: builtins.list[str] = json.loads(self._store.description(uri) or "{}")["key"]
        # the schema as of the epoch: a migration since may have changed the state columns
        schema = arrow_schema(self._store.at_version(uri, entry.table_versions[table]))
        values = [n for n in schema.names if n not in keys and n not in RESERVED_COLUMNS]
        return entry, uri, keys, values

    def sink(self, output: str, epoch: int | str | None = None) -> DataFrame:
        """A sink table as of a committed epoch.

        Raises:
            SnapshotNotFoundError: The output or epoch is unknown or not a snapshot (not
                committed yet, expired, or MERGED into a later snapshot).
        """
        table = sink_table(output)
        entry = self._committed(epoch, table, f"output {output!r}")
        return load_dataframe(self._spark(), entry.tables[table], entry.table_versions[table])

    def _committed(self, epoch: int | str | None, table: str, what: str) -> ManifestEntry:
        log = self._log()
        readable = log.snapshots()
        if not readable:
            raise SnapshotNotFoundError(f"snapshot root {self.root} has no committed epoch yet")
        entry = (
            readable[-1]
            if epoch is None
            else log.require_snapshot(log.resolve(epoch, self.root), self.root)
        )
        if table not in entry.table_versions:
            known = sorted(entry.table_versions)
            raise SnapshotNotFoundError(
                f"{what} is not in snapshot root {self.root}; it holds tables {known}"
            )
        return entry

    def _tables(self) -> builtins.list[str]:
        readable = self._log().snapshots()
        return list(readable[-1].table_versions) if readable else []

    def _log(self) -> EpochLog:
        # a copied root's entries name the original's tables: read them where they are now
        return load_epoch_log(self._store, self.root.manifest_uri)

    def _spark(self) -> SparkSession:
        if self.spark is not None:
            return self.spark
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is None:
            raise ConfigError(
                "reading snapshots as DataFrames needs a SparkSession; pass one to Snapshots()"
            )
        self.spark = active
        return active
