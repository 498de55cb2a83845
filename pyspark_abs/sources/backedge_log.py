"""Records in flight on a back-edge log: produced by an epoch, not yet read by the loop head."""

from __future__ import annotations

import json

import pyarrow as pa

from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.sources.delta.files import DeltaFilePartition, read_slice
from pyspark_abs.sources.delta.log import DeltaLog, ReadSchema
from pyspark_abs.sources.delta.offsets import SOURCE_NAME, Offset, plan_slices
from pyspark_abs.storage.root import backedge_table
from pyspark_abs.storage.schemas import arrow_schema
from pyspark_abs.storage.store import DeltaStore


def split_offsets(source_offsets: str | None) -> tuple[list[str], dict[str, Offset]]:
    """Separate an epoch's source offsets into other sources' lines and loop-head offsets.

    Returns:
        The lines of the other sources, in order, and each loop head's offset by edge id.
    """
    others: list[str] = []
    loops: dict[str, Offset] = {}
    for line in (source_offsets or "").splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict) and value.get("source") == SOURCE_NAME and value.get("tag"):
            offset = Offset.parse(value)
            assert offset.tag is not None
            loops[offset.tag] = offset
        else:
            others.append(line)
    return others, loops


def consumed_before(snapshot: ManifestEntry, edge_id: str) -> int:
    """The log version before which a snapshot had consumed all of an edge's records.

    The loop head of a run continuing from the snapshot, or from a later one, reads the
    log from this version on (its offsets only advance, and a restore epoch, which rewrites
    the log, is itself a later snapshot). A restore epoch rewrote the log at its own version
    and consumed everything before it; a snapshot without the edge, or whose source offsets
    lack the edge's loop head, consumed nothing (0).
    """
    table = backedge_table(edge_id)
    if table not in snapshot.table_versions:
        return 0
    if snapshot.is_restore:
        return snapshot.table_versions[table]
    return split_offsets(snapshot.source_offsets)[1].get(edge_id, Offset(0, 0)).version


def in_flight(store: DeltaStore, entry: ManifestEntry, edge_id: str) -> pa.Table:
    """The back-edge records in flight in a snapshot: produced, not yet consumed (L*).

    Raises:
        KeyError: The epoch has no such back-edge.
        SourceError: The log cannot be read (e.g. its files were vacuumed).
    """
    installed, parts, schema = _in_flight_parts(store, entry, edge_id)
    if installed is not None:
        return installed
    rows = [batch for part in parts for batch in read_slice(part, schema)]
    return pa.Table.from_batches(rows, schema=schema)


def in_flight_count(store: DeltaStore, entry: ManifestEntry, edge_id: str) -> int:
    """How many back-edge records are in flight in a snapshot, from the log alone."""
    installed, parts, _ = _in_flight_parts(store, entry, edge_id)
    if installed is not None:
        return int(installed.num_rows)
    return sum(p.stop - p.start for p in parts)


def _in_flight_parts(
    store: DeltaStore, entry: ManifestEntry, edge_id: str
) -> tuple[pa.Table | None, list[DeltaFilePartition], pa.Schema]:
    """A restore epoch's whole installed log, or the slices of the log still in flight."""
    from pyspark_abs.operators.arrow_types import to_spark

    table = backedge_table(edge_id)
    uri, version = entry.tables[table], entry.table_versions[table]
    if entry.is_restore:
        installed = store.read(uri, version)
        return installed, [], installed.schema
    schema = arrow_schema(store.open(uri))
    consumed = split_offsets(entry.source_offsets)[1].get(edge_id, Offset(0, 0))
    log = DeltaLog(uri, ReadSchema(to_spark(schema), (), version), changes="read")
    end = Offset(version + 1, 0)
    if end <= consumed:
        return None, [], schema
    slices = plan_slices(log.versions(consumed.version, version), consumed, end)
    parts = []
    for piece in slices:
        data = log.version(piece.version).files[piece.file]
        parts.append(DeltaFilePartition(uri, piece.version, data.path, piece.start, piece.stop, ()))
    return None, parts, schema
