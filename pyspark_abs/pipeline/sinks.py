"""Sinks of a pipeline's outputs: Delta tables, partitioned by plain columns."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from math import inf

import pyarrow as pa

from pyspark_abs.errors import (
    OperatorDefinitionError,
)
from pyspark_abs.faults import FaultInjector
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.protocol.publishing import KafkaPublisher, KafkaTarget
from pyspark_abs.storage.root import sink_table

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


@dataclass(frozen=True, kw_only=True)
class KafkaSink(DeltaSink):
    """A Delta table whose committed snapshots are also published, exactly once, to a topic.

    The table is the topic's outbox: once an epoch commits, its rows are sent in one Kafka
    transaction, so ``read_committed`` consumers see each committed row once and never a row of
    an epoch that was not committed. Each record carries the header ``pyspark-abs-epoch``.
    Needs ``pip install 'pyspark-abs[kafka]'``.

    Attributes:
        topic: The topic the rows go to.
        bootstrap_servers: Kafka's bootstrap servers.
        key: The column whose text is each record's key (None: records have no key).
        value: A string or binary column sent as each record's value (None: the row as JSON).
        options: More client settings (librdkafka names), e.g. ``security.protocol``.
        timeout_s: How long each Kafka call of a publication (start, flush, commit) may wait
            before the run stops with a ``PublishError``; the epoch stays committed and the
            next start publishes it.
    """

    topic: str
    bootstrap_servers: str
    key: str | None = None
    value: str | None = None
    options: Mapping[str, str] = field(default_factory=dict, hash=False)
    timeout_s: float = 60.0


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
        if isinstance(sink, KafkaSink):
            _check_kafka(name, output, schemas[output], sink)
        resolved[output] = replace(sink, partition_by=tuple(sink.partition_by))
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


_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def _check_kafka(name: str, output: str, schema: pa.Schema, sink: KafkaSink) -> None:
    where = f"pipeline {name!r}: the KafkaSink of output {output!r}"
    if not _TOPIC.fullmatch(sink.topic):
        raise OperatorDefinitionError(
            f"{where} has topic {sink.topic!r}; a topic name is 1 to 249 letters, digits, "
            f"'.', '_' or '-'"
        )
    if not sink.bootstrap_servers:
        raise OperatorDefinitionError(f"{where} needs bootstrap_servers, e.g. 'broker:9092'")
    timeout = sink.timeout_s
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < inf:
        raise OperatorDefinitionError(
            f"{where} has timeout_s={timeout!r}; give the seconds a Kafka call may wait, a "
            f"number above 0 such as 60"
        )
    for role, column in (("key", sink.key), ("value", sink.value)):
        if column is not None and column not in schema.names:
            raise OperatorDefinitionError(
                f"{where} takes its record {role} from column {column!r}, which is not an "
                f"output column ({schema.names})"
            )
    if sink.value is not None:
        kind = schema.field(sink.value).type
        if not (pa.types.is_string(kind) or pa.types.is_binary(kind)):
            raise OperatorDefinitionError(
                f"{where} sends column {sink.value!r} of type {kind} as record values; give "
                f"a string or binary column, or value=None to send each row as JSON"
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


def kafka_publishers(
    name: str,
    sinks: Mapping[str, DeltaSink],
    plan: OperatorPlan,
    tables: Mapping[str, str],
    root_id: str,
    faults: FaultInjector,
    *,
    snapshots: bool,
    remote: bool,
) -> list[KafkaPublisher]:
    """A publisher for each KafkaSink, bound to this root's id and the sink's output.

    Raises:
        OperatorDefinitionError: A KafkaSink with snapshots off or over Spark Connect.
    """
    kafka = {output: sink for output, sink in sinks.items() if isinstance(sink, KafkaSink)}
    if kafka and (remote or not snapshots):
        why = "over Spark Connect" if remote else "with snapshots off"
        raise OperatorDefinitionError(
            f"pipeline {name!r}: the KafkaSink of output(s) {sorted(kafka)} cannot run {why}: "
            f"it publishes the snapshots the manifest commits. Use a classic session with "
            f"snapshots on, or a DeltaSink"
        )
    schemas = dict(plan.outputs)
    return [
        KafkaPublisher(
            KafkaTarget(
                uri=tables[sink_table(output)],
                table=sink_table(output),
                output=output,
                topic=sink.topic,
                servers=sink.bootstrap_servers,
                key=sink.key,
                value=sink.value,
                options=dict(sink.options),
                timeout_s=float(sink.timeout_s),
                transactional_id=f"pyspark-abs.{root_id}.{output}",
                schema=schemas[output],
            ),
            faults,
        )
        for output, sink in kafka.items()
    ]
