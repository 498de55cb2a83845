"""Pipelines: a streaming source, a stateful operator, Delta sinks, and a snapshot root.

:class:`Pipeline` wires the ABS lifecycle into one streaming query::

    source ─► key groups ─► operator (applyInPandasWithState) ─► envelope
           ─► pre-commit tasks (files + barrier markers) ─► coordinator (foreachBatch):
              align ─► PREPARED ─► commit tables ─► COMMITTED
                                   (once per group of ``snapshot_interval`` epochs)

With back-edges, the input is the source plus a loop head per back-edge, which reads the
records that earlier epochs committed to the edge's log (see :mod:`pyspark_abs.pipeline.backedge`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import (
    ConfigError,
    OperatorDefinitionError,
)
from pyspark_abs.job_actions.state import Redeployed
from pyspark_abs.logs import logger, working_for
from pyspark_abs.operators.arrow_types import to_spark
from pyspark_abs.operators.contract import Operator
from pyspark_abs.operators.plan import (
    check_source,
    resolve_plan,
)
from pyspark_abs.pipeline.backedge import BackEdge, check_pipeline_back_edges
from pyspark_abs.pipeline.query import PipelineQuery, Quiescence
from pyspark_abs.pipeline.sinks import SinkLike, resolve_sinks
from pyspark_abs.pipeline.start import Trigger, start
from pyspark_abs.pipeline.wiring import (
    source_frame,
)
from pyspark_abs.protocol.listeners import SnapshotListener
from pyspark_abs.snapshots.reading import Snapshots
from pyspark_abs.sources import RewindableSource
from pyspark_abs.sources.channel.log import Channel
from pyspark_abs.sources.channel.source import ChannelSource
from pyspark_abs.storage.root import (
    SnapshotRoot,
    normalize_uri,
    sink_table,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logger(__name__)


class Pipeline:
    """A stateful streaming pipeline whose state and outputs are snapshotted each epoch.

    Example::

        pipeline = Pipeline(
            "wordcount",
            words,                      # a streaming DataFrame with a "word" column
            word_count,                 # an Operator
            root="/data/abs/wordcount",
            sinks={"output": "/data/tables/word_counts"},
        )
        query = pipeline.start(available_now=True)
        query.await_termination()
        pipeline.snapshots.state("word_count").show()
    """

    def __init__(
        self,
        name: str,
        source: DataFrame | RewindableSource,
        operator: Operator,
        *,
        root: str,
        sinks: Mapping[str, SinkLike] | SinkLike | None = None,
        checkpoint: str | None = None,
        config: AbsConfig | None = None,
        transform: Callable[[DataFrame], DataFrame] | None = None,
        back_edges: Sequence[BackEdge] | BackEdge = (),
        listeners: Sequence[SnapshotListener] = (),
    ) -> None:
        """Declare a pipeline.

        Args:
            name: Pipeline id; the snapshot root is bound to it.
            source: A streaming DataFrame holding the operator's key columns, or a
                :class:`~pyspark_abs.sources.DeltaSource`,
                :class:`~pyspark_abs.sources.FileSource`,
                :class:`~pyspark_abs.sources.KafkaSource`,
                :class:`~pyspark_abs.sources.SparkDeltaSource` or
                :class:`~pyspark_abs.sources.SparkFileSource`, which restore and rollback can
                rewind to a snapshot's offsets.
            operator: The stateful operator.
            root: Snapshot root for the manifest and the state table.
            sinks: Output name to Delta table, for every output that does not loop back; a
                single table when there is one such output.
            checkpoint: Spark checkpoint location (default: ``<root>/_checkpoint``).
            config: Snapshot configuration (default: from ``spark.abs.*`` Spark conf).
            transform: Applied to the source's DataFrame before the operator, e.g. to
                parse columns or set a watermark on a DeltaSource.
            back_edges: Outputs whose rows return as the operator's input in a later epoch
                (see :class:`~pyspark_abs.pipeline.backedge.BackEdge`).
            listeners: Receive each epoch's metrics as it is committed or aborted (see
                :class:`~pyspark_abs.protocol.listeners.SnapshotListener`).

        Raises:
            OperatorDefinitionError: The source, operator, sinks and back-edges do not fit
                together.
            ConfigError: The configuration is invalid, back-edges are declared with
                snapshots off, or a listener is not a SnapshotListener.
        """
        if (
            not isinstance(name, str)
            or not name
            or not name.replace("_", "").replace("-", "").isalnum()
        ):
            raise OperatorDefinitionError(
                f"pipeline name {name!r} must be non-empty and use only letters, digits, '_' "
                f"and '-'"
            )
        if not isinstance(operator, Operator):
            raise OperatorDefinitionError(
                f"pipeline {name!r}: operator must be built with @operator or "
                f"@vectorized_operator, got {type(operator).__name__}"
            )
        frame = source_frame(name, source, transform)
        self.name = name
        self.source = source
        self.transform = transform
        self.operator = operator
        self.spark = frame.sparkSession
        self.config = config if config is not None else AbsConfig.from_spark_conf(self.spark)
        self.root = SnapshotRoot(root)
        self.checkpoint = normalize_uri(checkpoint) if checkpoint else f"{self.root}/_checkpoint"
        self.plan = resolve_plan(
            name,
            frame,
            operator,
            self.config.snapshots,
            max_state_bytes=self.config.max_key_group_state_bytes,
        )
        check_source(name, operator, self.plan, frame.schema)
        self.frame = frame
        """The source's DataFrame, transformed: what the operator reads."""
        self.back_edges = (back_edges,) if isinstance(back_edges, BackEdge) else tuple(back_edges)
        named = sinks.keys() if isinstance(sinks, Mapping) else ()
        check_pipeline_back_edges(name, self.spark, self.config, self.plan, self.back_edges, named)
        looped = {edge.output for edge in self.back_edges}
        self.sinks = resolve_sinks(name, self.plan, {} if sinks is None else sinks, looped)
        strangers = [x for x in listeners if not isinstance(x, SnapshotListener)]
        if strangers:
            raise ConfigError(
                f"pipeline {name!r}: listeners must be SnapshotListener instances (subclass "
                f"pyspark_abs.SnapshotListener), got {type(strangers[0]).__name__}"
            )
        self.listeners = tuple(listeners)

    def sink_output(self, output: str | None = None) -> str:
        """The output ``output`` names, which must have a sink; the only one if None.

        Raises:
            OperatorDefinitionError: ``output`` has no sink (it is unknown or loops back),
                or it is None and the pipeline has several sinks.
        """
        if output is None and len(self.sinks) == 1:
            return next(iter(self.sinks))
        if output not in self.sinks:
            raise OperatorDefinitionError(
                f"pipeline {self.name!r} has no sink for output {output!r}; its sinks are "
                f"{sorted(self.sinks)}. Name one of them"
            )
        return output

    def channel(self, output: str | None = None) -> ChannelSource:
        """This pipeline's sink of ``output``, as the input channel of a downstream stage.

        The downstream pipeline reads it one epoch of this pipeline per micro-batch, so its
        epoch ``n`` holds exactly this pipeline's epoch-``n`` output, and the two form one
        job (see :class:`~pyspark_abs.job.declaration.Job`).

        Args:
            output: The output; may be left out when the pipeline has one sink.

        Raises:
            OperatorDefinitionError: ``output`` has no sink (it is unknown or loops back).
        """
        output = self.sink_output(output)
        return ChannelSource(
            (
                Channel(
                    name=self.name if len(self.sinks) == 1 else f"{self.name}.{output}",
                    stage=self.name,
                    root=self.root,
                    table=sink_table(output),
                    uri=normalize_uri(self.sinks[output].path),
                    schema=to_spark(dict(self.plan.outputs)[output]).json(),
                ),
            )
        )

    @property
    def snapshots(self) -> Snapshots:
        """Read access to this pipeline's snapshots."""
        return Snapshots(self.root, self.spark)

    def start(
        self, *, processing_time: str | None = None, available_now: bool = False
    ) -> PipelineQuery:
        """Recover the snapshot root, then start the streaming query.

        Args:
            processing_time: Trigger interval, e.g. ``"10 seconds"`` (default: as fast as
                possible).
            available_now: Process what is available now, then stop. With processing-time
                timeouts, Spark would run timeout micro-batches forever; the query stops at
                the first micro-batch that reads no input and changes nothing.

        Raises:
            SnapshotRootError: The root is not writable.
            FencingError: Another live run holds the snapshot root.
            PipelineMismatchError: The root or checkpoint belongs to another pipeline or
                checkpoint.
            TableSchemaError: An existing table has another schema.
            StateEvolutionError: The stored state has another schema than the operator
                declares, and its ``evolution=`` does not cover the difference.
        """
        with working_for(self.name):
            return self._start(processing_time, available_now, epoch_limit=None)

    def _start(
        self, processing_time: str | None, available_now: bool, epoch_limit: int | None
    ) -> PipelineQuery:
        started = start(self, Trigger(processing_time, available_now, epoch_limit))
        return PipelineQuery(
            started.query, started.run, self, started.recovered, started.stop_when_idle
        )

    def deployed(self) -> Redeployed:
        """This definition, as a job-wide migration of its state needs it."""
        return Redeployed(self.root, self.plan, self.operator.evolution, self.spark, self.config)

    def run(self) -> PipelineQuery:
        """Process everything available now, wait until done, and return the query.

        With back-edges, records that loop back after the start are left for the next run;
        :meth:`run_until_quiescent` runs until the loop has terminated.
        """
        query = self.start(available_now=True)
        query.await_termination()
        return query

    def run_until_quiescent(self, *, max_epochs: int = 1000) -> Quiescence:
        """Run until the computation has terminated, then stop.

        Terminated (quiescent) means that the sources have nothing more to read and the
        latest committed snapshot has no back-edge record in flight: no epoch would change
        anything. This is detected on the snapshots themselves, the first use of
        Chandy-Lamport snapshots (stable-property detection).

        Args:
            max_epochs: The most epochs to process. If the loop has not terminated by then,
                the run stops before the next epoch, with every processed epoch committed.

        Returns:
            The quiescent epoch, the epochs processed and the time taken.

        Raises:
            QuiescenceError: ``max_epochs`` epochs ran and records are still in flight.
            ConfigError: ``max_epochs`` is not a positive integer.
            AbsError: The pipeline failed; the error says where and what to do.
        """
        if isinstance(max_epochs, bool) or not isinstance(max_epochs, int) or max_epochs < 1:
            raise ConfigError(
                f"pipeline {self.name!r}: max_epochs must be a positive integer, got {max_epochs!r}"
            )
        started = time.perf_counter()
        query = self._start(None, False, epoch_limit=max_epochs)
        return query.until_quiescent(self.back_edges, started)
