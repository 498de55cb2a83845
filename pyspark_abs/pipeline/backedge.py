"""Back-edges: feedback loops whose records in flight are part of the snapshot (ABS Algorithm 2).

Spark cannot run a cyclic plan, so a cycle is cut at its back-edge. An operator output
declared as a :class:`BackEdge` is not written to a sink: its rows are committed in the
epoch's two-phase commit, like any output, to the back-edge log ``backedge/<edge>`` under the
snapshot root, and a *loop head*, a :class:`~pyspark_abs.sources.DeltaSource` over that log,
feeds them back as input of the same pipeline in a later epoch. Committing never waits for
the loop head, so a loop cannot deadlock the pipeline.

The snapshot of epoch e is the operator state of e plus the records the paper calls L*: the
back-edge records produced in epochs up to e that epoch e had not consumed yet. Both are
fixed by the manifest entry of e: the loop head's offset in the epoch's source offsets says
what was consumed, and the log's Delta version as of e says what was produced. A restore
epoch rewrites the log to exactly those records, so a pipeline restored from e replays them
exactly once, into any checkpoint and with any partition count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import pyarrow as pa

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import ConfigError, OperatorDefinitionError
from pyspark_abs.manifest.entries import ManifestEntry
from pyspark_abs.operators.arrow_types import to_spark
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.schema import to_arrow
from pyspark_abs.sources.delta.offsets import Offset
from pyspark_abs.sources.delta.source import DeltaSource
from pyspark_abs.storage.root import backedge_table
from pyspark_abs.storage.store import DeltaStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class BackEdge:
    """An operator output whose rows return as the operator's input in a later epoch.

    The rows must fit the operator's input: every column (after ``transform``) must be an
    input column of the same type, the key columns included; input columns the rows lack
    are null. Tell them apart from source rows by a column, e.g. one that only loop rows set.

    Attributes:
        output: The operator output that loops back. It gets no sink.
        name: The edge's id (default: the output's name); its log is ``backedge/<name>``
            under the snapshot root.
        transform: A stateless stage on the loop path, applied to the loop head's
            streaming DataFrame before it joins the input (e.g. to increment a counter or
            join a static table).
    """

    output: str
    name: str | None = None
    transform: Callable[[DataFrame], DataFrame] | None = None

    @property
    def edge_id(self) -> str:
        """The edge's id."""
        return self.name or self.output

    @property
    def table(self) -> str:
        """The table id of the edge's log."""
        return backedge_table(self.edge_id)


def check_back_edges(
    pipeline: str, edges: Sequence[BackEdge], outputs: Sequence[str], sinks: Iterable[str]
) -> None:
    """Check the declarations against the operator's outputs and the sinks.

    Raises:
        OperatorDefinitionError: An edge is not a BackEdge, names an unknown output, has a
            sink, shares an id or output with another edge, or has an invalid id.
    """
    seen_ids: set[str] = set()
    seen_outputs: set[str] = set()
    sinks = set(sinks)
    for edge in edges:
        if not isinstance(edge, BackEdge):
            raise OperatorDefinitionError(
                f"pipeline {pipeline!r}: back_edges takes BackEdge(...) declarations, got "
                f"{type(edge).__name__}"
            )
        edge_id = edge.edge_id
        if not isinstance(edge_id, str) or not edge_id.replace("_", "").replace("-", "").isalnum():
            raise OperatorDefinitionError(
                f"pipeline {pipeline!r}: back-edge id {edge_id!r} must use only letters, "
                f"digits, '_' and '-' (it names the table backedge/<id>)"
            )
        if edge.output not in outputs:
            raise OperatorDefinitionError(
                f"pipeline {pipeline!r}: back-edge {edge_id!r} loops output {edge.output!r}, "
                f"which the operator does not declare; its outputs are {list(outputs)}"
            )
        if edge.output in sinks:
            raise OperatorDefinitionError(
                f"pipeline {pipeline!r}: output {edge.output!r} loops back over back-edge "
                f"{edge_id!r} and also has a sink; an output goes to one or the other"
            )
        if edge_id in seen_ids or edge.output in seen_outputs:
            raise OperatorDefinitionError(
                f"pipeline {pipeline!r}: back-edge {edge_id!r} (output {edge.output!r}) is "
                f"declared twice; give each looped output one BackEdge"
            )
        seen_ids.add(edge_id)
        seen_outputs.add(edge.output)


def check_pipeline_back_edges(
    pipeline: str,
    spark: SparkSession,
    config: AbsConfig,
    plan: OperatorPlan,
    edges: Sequence[BackEdge],
    sinks: Iterable[str],
) -> None:
    """Check a pipeline's back-edges against its configuration, operator and sink names.

    Raises:
        ConfigError: Back-edges with snapshots off or a snapshot interval above 1.
        OperatorDefinitionError: See :func:`check_back_edges` and :func:`check_loop_schema`.
    """
    if not edges:
        return
    if not config.snapshots:
        raise ConfigError(
            f"pipeline {pipeline!r}: back-edges need snapshots (their records in flight "
            f"are part of each snapshot); set snapshots=True"
        )
    if config.snapshot_interval > 1:
        raise ConfigError(
            f"pipeline {pipeline!r}: back-edges need snapshot_interval=1, got "
            f"{config.snapshot_interval}: a record sent over a back-edge reaches the "
            f"loop head only once its epoch is committed, so the loop would wait for each "
            f"group of {config.snapshot_interval} epochs to fill; set "
            f"snapshot_interval=1"
        )
    outputs = dict(plan.outputs)
    check_back_edges(pipeline, edges, list(outputs), sinks)
    for edge in edges:
        rows = spark.createDataFrame([], to_spark(outputs[edge.output]))
        if edge.transform is not None:
            rows = edge.transform(rows)
        check_loop_schema(
            pipeline, edge, to_arrow(rows.schema), plan.input_schema, plan.key_columns
        )


def check_loop_schema(
    pipeline: str, edge: BackEdge, loop: pa.Schema, source: pa.Schema, key: Sequence[str]
) -> None:
    """Check that the loop's rows fit the operator's input.

    Args:
        pipeline: The pipeline, for messages.
        edge: The back-edge.
        loop: The columns of the loop's rows after the edge's transform.
        source: The operator's input columns.
        key: The operator's key columns.

    Raises:
        OperatorDefinitionError: A column is not an input column, has another type, or a
            key column is missing.
    """
    unknown = [name for name in loop.names if name not in source.names]
    retyped = [
        f"{f.name}: {f.type} (input: {source.field(f.name).type})"
        for f in loop
        if f.name in source.names and not f.type.equals(source.field(f.name).type)
    ]
    keyless = [k for k in key if k not in loop.names]
    if unknown or retyped or keyless:
        problems = []
        if unknown:
            problems.append(f"column(s) {unknown} are not input columns {source.names}")
        if retyped:
            problems.append(f"column types differ: {retyped}")
        if keyless:
            problems.append(f"key column(s) {keyless} are missing")
        raise OperatorDefinitionError(
            f"pipeline {pipeline!r}: rows of back-edge {edge.edge_id!r} (output "
            f"{edge.output!r}) do not fit the operator's input: {'; '.join(problems)}. Change "
            f"the output's schema or the edge's transform"
        )


def loop_head(
    spark: SparkSession, edge: BackEdge, uri: str, restore: ManifestEntry | None
) -> DataFrame:
    """The streaming DataFrame of an edge's records, with the edge's transform applied.

    A checkpoint that starts from a restore epoch reads the log from the restore epoch's
    version, which holds exactly the records in flight in the restored snapshot; if the
    snapshot had no such edge, none of the log's records are in flight and the log is read
    from its next version. Any other checkpoint reads the log from the start. Offsets carry
    the edge's id as their tag.
    """
    source = DeltaSource(uri, ignore_changes=True, tag=edge.edge_id)
    if restore is None:
        frame = source.load(spark)
    elif edge.table in restore.table_versions:
        start = restore.table_versions[edge.table]
        frame = replace(source, starting_version=start).load(spark)
    else:
        after = Offset(int(DeltaStore().open(uri).version()) + 1, 0)
        frame = source.load(spark, starting_offset=after.to_dict())
    return edge.transform(frame) if edge.transform is not None else frame
