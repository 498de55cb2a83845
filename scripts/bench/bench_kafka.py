"""Kafka -> pyspark-abs -> Delta against Spark's own aggregation on the same topic.

The keyed count of workload W (see ``_bench.py``) over a Kafka topic of two partitions whose
records' values are their keys, on a local KRaft broker (started here from the jars
``scripts/test`` fetches, unless ``--bootstrap-servers`` names one). Three variants:

* ``builtin``: ``groupBy("key").count()``, update mode, Spark's default state store, each
  micro-batch's counts appended to a Delta table by delta-rs in ``foreachBatch``;
* ``abs_async``: pyspark-abs, a snapshot every epoch, asynchronous commit, its sink a Delta
  table;
* ``abs_kafka_sink``: the same with a ``KafkaSink``: each committed epoch's counts are also
  published, exactly once, to a topic of their own.

Two measures, the variants interleaved in each:

* **throughput**: ``--records`` records already in the topic, read ``--records / --epochs``
  per micro-batch (``maxOffsetsPerTrigger``) to the end with ``availableNow``;
* **latency**: records produced at ``--rate`` per second for ``--seconds`` seconds into a new
  topic while the query runs with a ``--trigger`` processing-time trigger. A record's
  latency runs from its Kafka timestamp (set by the producer) to the moment the sink commit
  of the micro-batch that read it finished: the manifest's COMMITTED time for pyspark-abs,
  the end of ``foreachBatch``'s Delta append for Spark, and for ``abs_kafka_sink`` the end
  of the Kafka transaction that published it (when a snapshot listener hears of the epoch).
  p50 and p99 over all measured runs.

    python scripts/bench/bench_kafka.py [--records N] [--keys N] [--rate N] [--seconds N]

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _bench
import numpy as np
from deltalake import write_deltalake
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    EpochStatus,
    KafkaSink,
    KafkaSource,
    Pipeline,
    SnapshotInfo,
    SnapshotListener,
    Snapshots,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_bench.pickle_by_value(__name__)

VARIANTS = ["builtin", "abs_async", "abs_kafka_sink"]
TICK_SECONDS = 0.25
"""How often the latency run's producer writes a batch of records."""


def keys_of(records: DataFrame) -> DataFrame:
    """The records' keys: their values, as longs."""
    return records.select(F.col("value").cast("string").cast("long").alias("key"))


def produce(
    spark: SparkSession, servers: str, topic: str, first: int, count: int, keys: int
) -> None:
    """Write records ``first`` to ``first + count`` with uniform random keys below ``keys``."""
    key = F.pmod(F.xxhash64("id"), F.lit(keys)).cast("string")
    frame = spark.range(first, first + count, numPartitions=2).select(key.alias("value"))
    frame.write.format("kafka").option("kafka.bootstrap.servers", servers).option(
        "topic", topic
    ).save()


def options(servers: str, topic: str, per_batch: int | None) -> dict[str, str]:
    """The Kafka source's options: the whole topic, at most ``per_batch`` records a batch."""
    found = {"kafka.bootstrap.servers": servers, "subscribe": topic, "startingOffsets": "earliest"}
    if per_batch is not None:
        found["maxOffsetsPerTrigger"] = str(per_batch)
    return found


class Run(SnapshotListener):
    """One variant's query over a topic, in a fresh directory; its batches' visible times."""

    def __init__(self, spark: SparkSession, work: Path, variant: str, key_groups: int) -> None:
        self.spark, self.variant, self.key_groups = spark, variant, key_groups
        self.dir = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=work))
        self.checkpoint = self.dir / "_checkpoint"
        self.visible_ms: dict[int, float] = {}

    def start(self, source: Mapping[str, str], trigger: str | None) -> Callable[[], None]:
        """Start the query (``trigger`` None: to the end of the topic, and wait); return a
        function that processes what is available, then stops it."""
        if self.variant != "builtin":
            sink = str(self.dir / "counts")
            pipeline = Pipeline(
                "bench",
                KafkaSource(source),
                _bench.keyed_count,
                root=str(self.dir),
                sinks=sink if self.variant == "abs_async" else self._published(sink, source),
                checkpoint=str(self.checkpoint),
                config=AbsConfig(key_groups=self.key_groups, commit_mode="async"),
                transform=keys_of,
                listeners=[self],
            )
            if trigger is None:
                pipeline.run()
                return lambda: None
            running = pipeline.start(processing_time=trigger)

            def finish_pipeline() -> None:
                running.process_all_available()
                running.stop()

            return finish_pipeline
        counts = keys_of(self.spark.readStream.format("kafka").options(**source).load())
        writer = (
            counts.groupBy("key")
            .count()
            .writeStream.outputMode("update")
            .foreachBatch(self._append)
            .option("checkpointLocation", str(self.checkpoint))
        )
        if trigger is None:
            writer.trigger(availableNow=True).start().awaitTermination()
            return lambda: None
        query = writer.trigger(processingTime=trigger).start()

        def finish_query() -> None:
            query.processAllAvailable()
            query.stop()

        return finish_query

    def _published(self, sink: str, source: Mapping[str, str]) -> KafkaSink:
        servers = source["kafka.bootstrap.servers"]
        return KafkaSink(sink, topic=f"published-{self.dir.name}", bootstrap_servers=servers)

    def on_epoch_committed(self, info: SnapshotInfo) -> None:
        """Listeners hear of an epoch once it is committed and published."""
        if info.batch_id is not None:
            self.visible_ms[info.batch_id] = time.time() * 1000

    def _append(self, batch: DataFrame, batch_id: int) -> None:
        write_deltalake(str(self.dir / "counts"), batch.toArrow(), mode="append")
        self.visible_ms[batch_id] = time.time() * 1000

    def visible(self) -> dict[int, float]:
        """When each micro-batch's outputs became visible (ms since the epoch), by batch id."""
        if self.variant != "abs_async":
            return self.visible_ms  # batch ends of foreachBatch, or epochs published
        return {
            s.batch_id: s.recorded_at.timestamp() * 1000
            for s in Snapshots(str(self.dir)).list()
            if s.status is EpochStatus.COMMITTED and s.batch_id is not None
        }


def batch_ends(checkpoint: Path) -> dict[int, dict[int, int]]:
    """Each micro-batch's end offset per partition, from the checkpoint's offset log."""
    ends = {}
    for entry in (checkpoint / "offsets").iterdir():
        if entry.name.isdigit():
            topics = json.loads(entry.read_text().splitlines()[-1])
            (partitions,) = topics.values()
            ends[int(entry.name)] = {int(p): int(o) for p, o in partitions.items()}
    return ends


def latencies(
    produced: Mapping[int, tuple[np.ndarray, np.ndarray]],
    ends: Mapping[int, Mapping[int, int]],
    visible: Mapping[int, float],
) -> np.ndarray:
    """Each record's latency in ms: from its timestamp to its micro-batch's visible time.

    ``produced`` holds each partition's offsets and timestamps (ms); a record belongs to the
    first batch whose end offset in its partition lies beyond it.
    """
    batches = sorted(ends)
    found = []
    for partition, (offsets, stamps) in produced.items():
        limits = np.array([ends[b].get(partition, 0) for b in batches])
        seen = np.array([visible[b] for b in batches])
        found.append(seen[np.searchsorted(limits, offsets, side="right")] - stamps)
    return np.concatenate(found)


def records_of(
    spark: SparkSession, servers: str, topic: str, since: float
) -> dict[int, tuple[Any, Any]]:
    """Each partition's offsets and timestamps (ms) of the records produced from ``since``."""
    table = (
        spark.read.format("kafka")
        .options(**options(servers, topic, None))
        .load()
        .select("partition", "offset", F.unix_millis("timestamp").alias("ms"))
        .where(F.col("ms") >= since)
        .toPandas()
    )
    return {
        int(str(p)): (rows["offset"].to_numpy(), rows["ms"].to_numpy(dtype=np.float64))
        for p, rows in table.groupby("partition")
    }


@contextmanager
def broker(given: str | None, work: Path) -> Iterator[str]:
    """The bootstrap servers: ``given``, or a broker started here for the run."""
    if given:
        yield given
        return
    sys.path.insert(0, str(_bench.REPO))
    from tests.support.kafka import BROKER, kafka_broker

    if not os.environ.get(BROKER):
        raise SystemExit(f"set {BROKER} (scripts/test fetches a broker) or --bootstrap-servers")
    (work / "broker").mkdir()
    with kafka_broker(Path(os.environ[BROKER]), work / "broker") as servers:
        yield servers


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run both measures, print a table and a JSON line; return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    _bench.add_workload_arguments(parser, repeats=2)
    parser.add_argument("--rate", type=int, default=2000, help="records/s in the latency run")
    parser.add_argument("--seconds", type=float, default=20, help="length of the latency run")
    parser.add_argument("--trigger", default="1 second", help="the latency run's trigger")
    parser.add_argument("--bootstrap-servers", help="a running broker (default: start one)")
    parser.set_defaults(records=1_000_000, keys=100_000)
    args = parser.parse_args(argv)
    spark = _bench.session(args.partitions, jars=os.environ.get("ABS_KAFKA_JARS"))
    lags: dict[str, list[np.ndarray]] = {v: [] for v in VARIANTS}
    runs = itertools.count()
    with _bench.workdir(args.workdir) as work, broker(args.bootstrap_servers, work) as servers:
        produce(spark, servers, "throughput", 0, args.records, args.keys)

        def throughput(variant: str) -> float:
            run = Run(spark, work, variant, args.key_groups)
            started = time.perf_counter()
            run.start(options(servers, "throughput", args.records // args.epochs), None)
            seconds = time.perf_counter() - started
            shutil.rmtree(run.dir, ignore_errors=True)
            return seconds

        def latency(variant: str) -> float:
            run, topic = Run(spark, work, variant, args.key_groups), f"latency-{next(runs)}"
            produce(spark, servers, topic, 0, 1, args.keys)  # the topic exists before the query
            stop = run.start(options(servers, topic, None), args.trigger)
            started, since = time.perf_counter(), time.time() * 1000
            feed(spark, servers, topic, args)
            stop()
            seconds = time.perf_counter() - started
            produced = records_of(spark, servers, topic, since)
            found = latencies(produced, batch_ends(run.checkpoint), run.visible())
            lags[variant].append(found)
            shutil.rmtree(run.dir, ignore_errors=True)
            return seconds

        seconds = _bench.interleave(VARIANTS, args.repeats, throughput, warm_up=args.warm_up)
        _bench.interleave(VARIANTS, args.repeats, latency, warm_up=False)

    rate = {v: args.records / _bench.median(s) for v, s in seconds.items()}
    _bench.print_rates(args.records, seconds, "builtin")
    pooled = {v: np.concatenate(found) for v, found in lags.items()}
    percentiles = {
        v: {"p50": round(float(np.percentile(x, 50))), "p99": round(float(np.percentile(x, 99)))}
        for v, x in pooled.items()
    }
    print(f"\nlatency, produced -> visible in the sink ({args.rate} records/s, {args.trigger}):")
    for variant, found in percentiles.items():
        print(f"{variant:<14} p50 {found['p50']:>6} ms   p99 {found['p99']:>6} ms")
    figures = {
        **_bench.workload_figures(args),
        "rate": args.rate,
        "trigger": args.trigger,
        "records_per_s": {v: round(r) for v, r in rate.items()},
        "abs_async_vs_builtin": round(rate["abs_async"] / rate["builtin"], 3),
        "kafka_sink_vs_abs_async": round(rate["abs_kafka_sink"] / rate["abs_async"], 3),
        "latency_ms": percentiles,
        "latency_records": {v: int(x.size) for v, x in pooled.items()},
        "seconds": {v: [round(x, 2) for x in s] for v, s in seconds.items()},
    }
    _bench.emit(figures)
    return figures


def feed(spark: SparkSession, servers: str, topic: str, args: argparse.Namespace) -> None:
    """Produce ``args.rate`` records a second for ``args.seconds`` seconds, a batch a tick."""
    per_tick, ticks = max(1, round(args.rate * TICK_SECONDS)), round(args.seconds / TICK_SECONDS)
    started = time.monotonic()
    for tick in range(ticks):
        produce(spark, servers, topic, 1 + tick * per_tick, per_tick, args.keys)
        time.sleep(max(0.0, started + (tick + 1) * TICK_SECONDS - time.monotonic()))


if __name__ == "__main__":
    main()
