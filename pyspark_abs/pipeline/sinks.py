"""Sinks of a pipeline's outputs: Delta tables, partitioned by plain columns."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from pyspark_abs.errors import (
    OperatorDefinitionError,
)
from pyspark_abs.operators.plan import OperatorPlan

_PARTITION_TYPES = (
    pa.types.is_string,
    pa.types.is_integer,
    pa.types.is_date32,
    pa.types.is_boolean,
)


@dataclass(frozen=True)
class DeltaSink:
    """A Delta table an operator output is committed to.

    Attributes:
        path: The table's location (local path or object-store URL).
        partition_by: Hive partition columns (string, integer, date or boolean).
    """

    path: str
    partition_by: tuple[str, ...] = ()


SinkLike = str | DeltaSink


def resolve_sinks(
    name: str, plan: OperatorPlan, sinks: Mapping[str, SinkLike] | SinkLike, looped: set[str]
) -> dict[str, DeltaSink]:
    """The sink of each operator output that does not loop back, checked against the plan."""
    outputs = [out for out, _ in plan.outputs if out not in looped]
    if isinstance(sinks, (str, DeltaSink)):
        if len(outputs) != 1:
            raise OperatorDefinitionError(
                f"pipeline {name!r}: operator {plan.name!r} has outputs {outputs}; pass sinks "
                f"as a dict from output name to table"
            )
        sinks = {outputs[0]: sinks}
    if not isinstance(sinks, Mapping):
        raise OperatorDefinitionError(
            f"pipeline {name!r}: sinks must be a table path, a DeltaSink, or a dict of them"
        )
    missing = [o for o in outputs if o not in sinks]
    extra = [s for s in sinks if s not in outputs]
    if missing or extra:
        raise OperatorDefinitionError(
            f"pipeline {name!r}: every output of operator {plan.name!r} that does not loop "
            f"back needs exactly one sink; missing {missing}, unknown {extra}"
        )
    resolved = {}
    schemas = dict(plan.outputs)
    for output in outputs:
        sink = sinks[output]
        sink = sink if isinstance(sink, DeltaSink) else DeltaSink(str(sink))
        _refuse_table_name(name, output, sink.path)
        _check_partitioning(name, output, schemas[output], sink.partition_by)
        resolved[output] = DeltaSink(sink.path, tuple(sink.partition_by))
    return resolved


_TABLE_NAME = re.compile(r"`?\w+`?\.`?\w+`?\.`?\w+`?")


def _refuse_table_name(name: str, output: str, path: str) -> None:
    """Refuse a catalog table name given where a path belongs (it would be a local folder)."""
    if _TABLE_NAME.fullmatch(path):
        raise OperatorDefinitionError(
            f"pipeline {name!r}: the sink of output {output!r} is {path!r}, a catalog table "
            f"name; sinks are Delta tables at a path, committed by delta-rs, which cannot "
            f"commit to Unity Catalog managed tables. Give a path: an external location "
            f"(s3://..., abfss://..., gs://...) or a Volume (/Volumes/<catalog>/<schema>/"
            f"<volume>/...), and register it with CREATE TABLE ... LOCATION to query it by name"
        )


def _check_partitioning(name: str, output: str, schema: pa.Schema, columns: Sequence[str]) -> None:
    for column in columns:
        if column not in schema.names:
            raise OperatorDefinitionError(
                f"pipeline {name!r}: sink of output {output!r} is partitioned by {column!r}, "
                f"which is not an output column ({schema.names})"
            )
        kind = schema.field(column).type
        if not any(check(kind) for check in _PARTITION_TYPES):
            raise OperatorDefinitionError(
                f"pipeline {name!r}: sink of output {output!r} cannot be partitioned by "
                f"{column!r} of type {kind}; use a string, integer, date or boolean column"
            )
    if len(columns) and len(columns) == len(schema.names):
        raise OperatorDefinitionError(
            f"pipeline {name!r}: sink of output {output!r} must keep at least one column "
            f"that is not a partition column"
        )
