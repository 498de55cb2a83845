"""Probe for the operator's execution path: the per-epoch floor of each way to call Python.

On a trickle (a small file per micro-batch) an epoch of pyspark-abs costs more than Spark's
own aggregation, and the cost is per call of the Python operator, not per snapshot. This
probe measures how much of that any per-key-group call costs, whoever makes it, by counting
records per key seven ways on the same files, one file per micro-batch (``availableNow``):

* ``builtin``: Spark's ``groupBy("key").count()``, default state store;
* ``grouped_state``: plain PySpark ``applyInPandasWithState`` grouped by key group
  (``--key-groups``), each key group's counts pickled in Spark's state store: the path
  pyspark-abs runs on, without pyspark-abs;
* ``grouped_state_fewer``: the same with an eighth of the key groups;
* ``transform_with_state``: plain PySpark ``transformWithStateInPandas`` (Spark's second
  stateful API, on its RocksDB state store with changelog checkpointing) grouped by key
  group, each key group's counts pickled in a value state;
* ``grouped_arrow``: plain PySpark ``applyInArrow`` grouped by key group, stateless, each
  key group's counts in a local file: a grouped call without Spark's stateful operator;
* ``partition_arrow``: one ``mapInArrow`` call per shuffle partition, the partition's counts
  in a local file;
* ``abs_async``: pyspark-abs, a snapshot every epoch, ``--key-groups`` key groups;
* ``abs_async_arrow``: the same with the keyed count written as an ``arrow_operator``.

The two variants with local files are floors, not designs: a retried task would count twice.

Every variant's output is checked against the input's own count. It prints the median epoch
time (Spark's ``triggerExecution`` of the micro-batches that read input) and the median CPU
seconds per epoch of the Python workers and of the JVM (a run's CPU over its files, the
query's start included); the last line is one JSON object.

    python scripts/bench/probe_call_floor.py [--files 20] [--records-per-file 200] [--keys 1000]
        [--key-groups 256] [--partitions 4] [--repeats 2] [--variants builtin,...]
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _bench
import _costs
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from pyspark_abs import AbsConfig, Pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, GroupedData, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.state import GroupState

_bench.pickle_by_value(__name__)

COUNTS = "key long, count long"


def parquet_sink(out: Path) -> Callable[[DataFrame, int], None]:
    """A ``foreachBatch`` function appending each micro-batch's rows to Parquet files."""

    def append(batch: DataFrame, batch_id: int) -> None:
        batch.write.mode("append").parquet(str(out))

    return append


def counted(frames: Iterator[pd.DataFrame], held: dict[int, int]) -> pd.DataFrame:
    """The new count of each key in ``frames``, updating ``held`` (key to count)."""
    keys, seen = np.unique(pd.concat(list(frames))["key"].to_numpy(), return_counts=True)
    counts = [held.get(k, 0) + n for k, n in zip(keys.tolist(), seen.tolist(), strict=True)]
    held.update(zip(keys.tolist(), counts, strict=True))
    return pd.DataFrame({"key": keys, "count": np.asarray(counts, dtype=np.int64)})


def count_key_group(
    key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """``applyInPandasWithState``: a key group's counts, pickled in Spark's state store."""
    held: dict[int, int] = pickle.loads(state.get[0]) if state.exists else {}
    out = counted(frames, held)
    state.update((pickle.dumps(held),))
    yield out


class CountKeyGroup(StatefulProcessor):
    """``transformWithStateInPandas``: a key group's counts, pickled in a value state."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.held = handle.getValueState("held", "counts binary")

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        stored = self.held.get()
        held: dict[int, int] = pickle.loads(stored[0]) if stored is not None else {}
        out = counted(rows, held)
        self.held.update((pickle.dumps(held),))
        yield out

    def close(self) -> None:
        pass


def count_partition(folder: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``mapInArrow``: a partition's counts, kept in a local file named after the partition."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        path = Path(folder) / f"partition-{context.partitionId()}.pickle"
        held: dict[int, int] = pickle.loads(path.read_bytes()) if path.exists() else {}
        frames = (b.to_pandas() for b in batches)
        out = counted(frames, held)
        path.write_bytes(pickle.dumps(held))
        yield pa.RecordBatch.from_pandas(out, preserve_index=False)

    return run


def count_group_arrow(folder: str) -> Callable[[pa.Table], pa.Table]:
    """``applyInArrow``: a key group's counts, kept in a local file named after the group."""

    def run(rows: pa.Table) -> pa.Table:
        path = Path(folder) / f"group-{rows['key_group'][0].as_py()}.pickle"
        held: dict[int, int] = pickle.loads(path.read_bytes()) if path.exists() else {}
        out = counted(iter([rows.select(["key"]).to_pandas()]), held)
        path.write_bytes(pickle.dumps(held))
        return pa.Table.from_pandas(out, preserve_index=False)

    return run


def start(frame: DataFrame, work: Path, mode: str) -> StreamingQuery:
    """Run ``frame`` over every available file into Parquet under ``work``."""
    writer = frame.writeStream.outputMode(mode).foreachBatch(parquet_sink(work / "counts"))
    query = writer.option("checkpointLocation", str(work / "_checkpoint"))
    return query.trigger(availableNow=True).start()


def by_key_group(source: DataFrame, key_groups: int) -> GroupedData:
    return source.withColumn("key_group", F.expr(f"pmod(hash(key), {key_groups})")).groupBy(
        "key_group"
    )


def local_folder(work: Path) -> str:
    """A new folder under ``work`` for a variant's local files."""
    folder = work / "local"
    folder.mkdir()
    return str(folder)


def builtin(spark: SparkSession, source: DataFrame, work: Path, groups: int) -> StreamingQuery:
    return start(source.groupBy("key").count(), work, "update")


def grouped_state(
    spark: SparkSession, source: DataFrame, work: Path, groups: int
) -> StreamingQuery:
    counts = by_key_group(source, groups).applyInPandasWithState(
        count_key_group, COUNTS, "counts binary", "update", GroupStateTimeout.NoTimeout
    )
    return start(counts, work, "update")


def grouped_state_fewer(
    spark: SparkSession, source: DataFrame, work: Path, groups: int
) -> StreamingQuery:
    return grouped_state(spark, source, work, max(1, groups // 8))


def transform_with_state(
    spark: SparkSession, source: DataFrame, work: Path, groups: int
) -> StreamingQuery:
    grouped = by_key_group(source, groups)
    counts = grouped.transformWithStateInPandas(CountKeyGroup(), COUNTS, "Update", "None")
    with _bench.session_conf(spark, _bench.ROCKSDB):
        return start(counts, work, "update")


def grouped_arrow(
    spark: SparkSession, source: DataFrame, work: Path, groups: int
) -> StreamingQuery:
    counts = by_key_group(source, groups).applyInArrow(
        count_group_arrow(local_folder(work)), COUNTS
    )
    return start(counts, work, "append")


def partition_arrow(
    spark: SparkSession, source: DataFrame, work: Path, groups: int
) -> StreamingQuery:
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions") or 1)
    by_partition = source.repartition(partitions, "key")
    return start(
        by_partition.mapInArrow(count_partition(local_folder(work)), COUNTS), work, "append"
    )


QUERIES: dict[str, Callable[[SparkSession, DataFrame, Path, int], StreamingQuery]] = {
    query.__name__: query
    for query in [
        builtin,
        grouped_state,
        grouped_state_fewer,
        transform_with_state,
        grouped_arrow,
        partition_arrow,
    ]
}
ABS = {"abs_async": _bench.keyed_count, "abs_async_arrow": _bench.keyed_count_arrow}
"""pyspark-abs's variants: the keyed count in the pandas form, and in the Arrow form."""
VARIANTS = [*QUERIES, *ABS]


def run_variant(
    variant: str, spark: SparkSession, source: DataFrame, work: Path, key_groups: int
) -> tuple[StreamingQuery, pa.Table]:
    """Run one variant to the end of its input; its query and its output rows."""
    if variant in ABS:
        config = AbsConfig(key_groups=key_groups, commit_mode="async")
        sink = str(work / "counts")
        pipeline = Pipeline(
            "probe", source, ABS[variant], root=str(work / "root"), sinks=sink, config=config
        )
        query = pipeline.run().query
        return query, DeltaTable(sink).to_pyarrow_table(columns=["key", "count"])
    query = QUERIES[variant](spark, source, work, key_groups)
    query.awaitTermination()
    return query, ds.dataset(str(work / "counts")).to_table(columns=["key", "count"])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every variant, interleaved; print a table and a JSON line; return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--records-per-file", type=int, default=200)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--key-groups", type=int, default=256)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, from {','.join(VARIANTS)} (builtin is always run)",
    )
    args = parser.parse_args(argv)
    asked = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(asked) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {VARIANTS}")
    variants = [v for v in VARIANTS if v == "builtin" or v in asked]
    spark = _bench.session(args.partitions)
    epochs: dict[str, list[float]] = {v: [] for v in variants}
    costs: dict[str, _costs.RunCosts] = {}
    runs = 0
    work = Path(tempfile.mkdtemp(prefix="abs-probe-"))

    def run(variant: str) -> float:
        nonlocal runs
        runs += 1
        scratch = work / f"{variant}-{runs}"
        landing = scratch / "input"
        landing.mkdir(parents=True)
        rng = np.random.default_rng(runs)
        for index in range(args.files):
            keys = rng.integers(0, args.keys, args.records_per_file, dtype=np.int64)
            pq.write_table(pa.table({"key": keys}), landing / f"file-{index:05d}.parquet")
        source = _bench.parquet_source(spark, landing)
        query, rows = run_variant(variant, spark, source, scratch, args.key_groups)
        found, expected = _bench.records_counted(rows), args.files * args.records_per_file
        if found != expected:
            raise SystemExit(f"{variant} counted {found} records of {expected}")
        times = [
            float(p.durationMs["triggerExecution"]) for p in query.recentProgress if p.numInputRows
        ]
        epochs[variant] += times[1:]  # the first micro-batch also plans the query
        shutil.rmtree(scratch, ignore_errors=True)
        return sum(times) / 1000

    try:
        if args.warm_up:
            for variant in variants:
                run(variant)
            epochs = {v: [] for v in variants}
        _bench.interleave(variants, args.repeats, _bench.measured(spark, costs, run), warm_up=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def per_file(variant: str, kind: str) -> float:
        seconds = costs[variant].measured_cpu_by_process(args.repeats).get(kind, 0.0)
        return round(1000 * seconds / int(args.files), 1)

    figures_by_variant = {
        v: {
            "epoch_ms_median": round(statistics.median(epochs[v]), 1),
            "python_cpu_ms_per_file": per_file(v, "python_workers"),
            "jvm_cpu_ms_per_file": per_file(v, "jvm"),
        }
        for v in variants
    }
    print(
        f"\n{'variant':<22} {'epoch ms':>9} {'Python CPU ms':>14} {'JVM CPU ms':>11}"
        f" {'vs builtin':>11}"
    )
    builtin = figures_by_variant["builtin"]["epoch_ms_median"]
    for variant, f in figures_by_variant.items():
        ratio = f["epoch_ms_median"] / builtin
        print(
            f"{variant:<22} {f['epoch_ms_median']:>9.1f} {f['python_cpu_ms_per_file']:>14.1f} "
            f"{f['jvm_cpu_ms_per_file']:>11.1f} {ratio:>11.2f}"
        )
    figures = {
        "settings": {
            "files": args.files,
            "records_per_file": args.records_per_file,
            "keys": args.keys,
            "key_groups": args.key_groups,
            "partitions": args.partitions,
            "repeats": args.repeats,
        },
        "variants": figures_by_variant,
    }
    _bench.emit(figures)
    return figures


if __name__ == "__main__":
    main()
