"""Probe for an operator path without Spark's stateful operator: what Spark would stop doing.

``applyInPandasWithState`` costs more per epoch than a stateless grouped ``applyInArrow``
call per key group (see ``probe_call_floor.py``), but it does two things for the operator
that a stateless call does not, and this probe measures both on the same event-time input
(one file per micro-batch, ``availableNow``, watermark delay 0, ``--key-groups`` key
groups), two ways:

* ``stateful``: ``applyInPandasWithState`` grouped by key group, an event-time timeout set
  in every key group it calls;
* ``grouped_arrow``: a stateless query whose ``foreachBatch`` runs ``applyInArrow`` grouped
  by key group on each micro-batch (there, a driver could add rows of its own to the batch,
  such as one per key group with a timer due).

Every call records its key group, micro-batch and executor (the Python daemon that forked
its worker: one per executor). The probe reports, per way:

* ``no_data_batches``: micro-batches Spark ran without input; with a stateful operator, Spark
  runs one when the watermark passes a timeout, which is when timers fire on a quiet stream;
* ``moved_share``: of the key groups called in two consecutive micro-batches, the share
  whose executor changed. A moved key group finds no local live state and rebuilds it from
  the snapshot: Spark's state store keeps a partition on the executor holding its state,
  while the tasks of a plain shuffle go wherever a core is free.

On ``--master local[...]`` there is one executor and nothing can move; ``--master
standalone`` starts a two-worker standalone cluster on this machine (see
``bench_scaling.py``). The last line printed is one JSON object.

    python scripts/bench/probe_arrow_path.py [--files 12] [--records-per-file 400] [--keys 1000]
        [--key-groups 32] [--partitions 4] [--master standalone]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _bench
import bench_scaling
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyspark.sql import functions as F
from pyspark.sql.streaming.state import GroupStateTimeout

from pyspark_abs.operators.task import current_epoch

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.state import GroupState

_bench.pickle_by_value(__name__)

WAYS = ["stateful", "grouped_arrow"]
CALLS = "key_group long, batch long, executor long"


def batch_id() -> int:
    """The micro-batch of the running task (Spark sets it on the stream's jobs)."""
    epoch = current_epoch()
    assert epoch is not None, "a task outside a streaming micro-batch"
    return epoch


def stateful_call(
    key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: GroupState
) -> Iterator[pd.DataFrame]:
    """``applyInPandasWithState``: record the call and set an event-time timeout."""
    for _ in frames:
        pass
    if state.hasTimedOut:
        state.remove()
    else:
        state.update((1,))
        state.setTimeoutTimestamp(state.getCurrentWatermarkMs() + 5_000)
    call = {"key_group": [int(key[0])], "batch": [batch_id()], "executor": [os.getppid()]}
    yield pd.DataFrame(call)


def arrow_call(rows: pa.Table) -> pa.Table:
    """``applyInArrow``: record the call."""
    group = rows["key_group"][0].as_py()
    return pa.table({"key_group": [group], "batch": [batch_id()], "executor": [os.getppid()]})


def grouped_in_batch(out: Path) -> Callable[[DataFrame, int], None]:
    """``foreachBatch``: the key groups' calls on the micro-batch, appended to Parquet."""

    def run(batch: DataFrame, _: int) -> None:
        calls = batch.groupBy("key_group").applyInArrow(arrow_call, CALLS)
        calls.write.mode("append").parquet(str(out))

    return run


def start(way: str, source: DataFrame, work: Path, key_groups: int) -> StreamingQuery:
    """Run one way to the end of its input, the calls into Parquet under ``work``."""
    grouped = source.withWatermark("ts", "0 seconds").withColumn(
        "key_group", F.expr(f"pmod(hash(key), {key_groups})")
    )
    if way == "stateful":
        calls = grouped.groupBy("key_group").applyInPandasWithState(
            stateful_call, CALLS, "n long", "append", GroupStateTimeout.EventTimeTimeout
        )
        writer = calls.writeStream.outputMode("append").foreachBatch(
            lambda batch, _: batch.write.mode("append").parquet(str(work / "calls"))
        )
    else:
        writer = grouped.writeStream.foreachBatch(grouped_in_batch(work / "calls"))
    writer = writer.option("checkpointLocation", str(work / "_checkpoint"))
    return writer.trigger(availableNow=True).start()


def moved_share(calls: pa.Table) -> float:
    """Of the key groups called in two consecutive micro-batches, the share that moved."""
    frame = calls.to_pandas().sort_values(["key_group", "batch"])
    previous = frame.groupby("key_group").shift(1)
    consecutive = previous["batch"] == frame["batch"] - 1
    if not consecutive.any():
        return 0.0
    moved = frame.loc[consecutive, "executor"] != previous.loc[consecutive, "executor"]
    return round(float(moved.mean()), 3)


def write_events(landing: Path, files: int, records: int, keys: int) -> None:
    """``files`` Parquet files of ``(key, ts)``, event times rising ten seconds a file."""
    rng = np.random.default_rng(0)
    landing.mkdir(parents=True)
    for index in range(files):
        seconds = index * 10 + rng.integers(0, 10, records)
        keys_of_file = pa.array(rng.integers(0, keys, records, dtype=np.int64))
        times = pa.array(seconds * 1_000_000, pa.timestamp("us", tz="UTC"))
        table = pa.table({"key": keys_of_file, "ts": times})
        path = landing / f"file-{index:05d}.parquet"
        pq.write_table(table, path)
        os.utime(path, (1_000_000 + index, 1_000_000 + index))  # read in this order


def probe(spark: SparkSession, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Run each way on the session; the figures per way."""
    landing = work / "input"
    write_events(landing, args.files, args.records_per_file, args.keys)
    figures: dict[str, Any] = {}
    for way in WAYS:
        scratch = work / way
        reader = spark.readStream.schema("key long, ts timestamp").option("maxFilesPerTrigger", 1)
        query = start(way, reader.parquet(str(landing)), scratch, args.key_groups)
        query.awaitTermination()
        calls = ds.dataset(str(scratch / "calls")).to_table()
        progress = query.recentProgress
        figures[way] = {
            "micro_batches": len(progress),
            "no_data_batches": sum(1 for p in progress if not p.numInputRows),
            "executors": len(set(calls["executor"].to_pylist())),
            "moved_share": moved_share(calls),
        }
        shutil.rmtree(scratch, ignore_errors=True)
    return figures


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run both ways on ``--master``; print a table and a JSON line; return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--files", type=int, default=12)
    parser.add_argument("--records-per-file", type=int, default=400)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--key-groups", type=int, default=32)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument(
        "--master", default="", help="a master URL, or 'standalone' (default: the session's)"
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="abs-arrow-path-"))
    try:
        with contextlib.ExitStack() as stack:
            if args.master == bench_scaling.STANDALONE:
                url, _ = stack.enter_context(bench_scaling.standalone_cluster(work))
                spark = bench_scaling.session_for(url, args.partitions)
                stack.callback(spark.stop)
                bench_scaling.wait_for_executors(spark, bench_scaling.WORKERS)
            elif args.master:
                spark = bench_scaling.session_for(args.master, args.partitions)
            else:
                spark = _bench.session(args.partitions)
            figures = probe(spark, args, work)
            master = str(spark.sparkContext.master)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmaster {master}")
    print(f"{'way':<15} {'batches':>8} {'no-data':>8} {'executors':>10} {'moved':>7}")
    for way, f in figures.items():
        print(
            f"{way:<15} {f['micro_batches']:>8} {f['no_data_batches']:>8} "
            f"{f['executors']:>10} {f['moved_share']:>7.3f}"
        )
    result = {"master": master, "key_groups": args.key_groups, "ways": figures}
    _bench.emit(result)
    return result


if __name__ == "__main__":
    main()
