"""The tables a pipeline's epochs write: its state table, back-edge logs and sinks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark_abs.operators.envelope import Kind
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.pipeline.backedge import BackEdge
from pyspark_abs.pipeline.sinks import DeltaSink
from pyspark_abs.protocol.layout import SnapshotLayout
from pyspark_abs.protocol.precommit import TableTarget
from pyspark_abs.snapshots.reading import state_table_description
from pyspark_abs.storage.root import SnapshotRoot, normalize_uri, sink_table, state_table
from pyspark_abs.storage.store import TableSpec


def table_targets(
    root: SnapshotRoot,
    plan: OperatorPlan,
    snapshots: bool,
    back_edges: Sequence[BackEdge],
    sinks: Mapping[str, DeltaSink],
) -> tuple[TableTarget, ...]:
    """The tables an epoch writes: the state table (with snapshots), back-edge logs, sinks."""
    targets = []
    if snapshots:
        targets.append(
            TableTarget(
                table=state_table(plan.name),
                uri=root.table_uri(state_table(plan.name)),
                kind=Kind.STATE,
                index=0,
                payload_schema=plan.change_schema,
                table_schema=plan.state_table_schema,
            )
        )
    edges = {edge.output: edge for edge in back_edges}
    for index, (output, schema) in enumerate(plan.outputs):
        if output in edges:
            table = edges[output].table
            targets.append(
                TableTarget(
                    table,
                    root.table_uri(table),
                    Kind.OUTPUT,
                    index,
                    schema,
                    schema,
                )
            )
            continue
        sink = sinks[output]
        targets.append(
            TableTarget(
                table=sink_table(output),
                uri=normalize_uri(sink.path),
                kind=Kind.OUTPUT,
                index=index,
                payload_schema=schema,
                table_schema=schema,
                partition_by=sink.partition_by,
            )
        )
    return tuple(targets)


def table_specs(layout: SnapshotLayout, plan: OperatorPlan) -> list[TableSpec]:
    """How to create each table of ``layout`` that does not exist yet."""
    return [
        TableSpec(
            target.table,
            target.uri,
            target.table_schema,
            target.partition_by,
            state_table_description(plan) if target.kind is Kind.STATE else None,
        )
        for target in layout.targets
    ]
