"""pyspark-abs's tumbling window against Spark's own windowed aggregation, in one run.

Workload: RECORDS events over KEYS uniform random users in EPOCHS epochs, one Parquet file
per epoch read one per micro-batch; epoch ``i`` holds event times in minutes
``[10 i, 10 i + 10)``, with a watermark on them (no delay). Each variant counts and sums the
events per user and 5-minute window and appends each window once, when it closes:

* ``builtin_window``: ``groupBy(window("ts", "5 minutes"), "user").agg(count, sum)``, append
  mode, Spark's default state store, output appended as Parquet from ``foreachBatch``;
* ``abs_baseline``: :func:`pyspark_abs.tumbling_window` with ``snapshots=False``;
* ``abs_async``: the same, snapshotting every epoch, asynchronous commit.

Variants are interleaved; medians are compared. The last line printed is one JSON object.

    python scripts/bench/bench_windows.py [--records N] [--keys N] [--epochs N] [--repeats N]
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _bench
import _costs
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from pyspark_abs import AbsConfig, tumbling_window

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_bench.pickle_by_value(__name__)

ABS: dict[str, dict[str, Any]] = {
    "abs_baseline": {"snapshots": False},
    "abs_async": {"commit_mode": "async"},
}
VARIANTS = ["builtin_window", *ABS]
START_S = 1_800_000_000 - 1_800_000_000 % 600
WINDOWS = tumbling_window(
    key={"user": "bigint"},
    time="ts",
    size=dt.timedelta(minutes=5),
    aggregates={"events": "count(*)", "spent": "sum(amount)"},
    name="spend_per_5m",
)


def generate(directory: Path, records: int, keys: int, epochs: int) -> Path:
    """Epoch ``i``'s events in one Parquet file, times in its own ten minutes."""
    rng = np.random.default_rng(1506)
    directory.mkdir(parents=True)
    per_epoch = records // epochs
    for epoch in range(epochs):
        seconds = START_S + epoch * 600 + rng.integers(0, 600, per_epoch)
        table = pa.table(
            {
                "user": pa.array(rng.integers(0, keys, per_epoch, dtype=np.int64)),
                "ts": pa.array(seconds * 1_000_000, pa.timestamp("us", "UTC")),
                "amount": pa.array(rng.random(per_epoch)),
            }
        )
        pq.write_table(table, directory / f"epoch-{epoch:04d}.parquet")
    return directory


def source(spark: SparkSession, inputs: Path) -> DataFrame:
    reader = spark.readStream.schema("user long, ts timestamp, amount double")
    events = reader.option("maxFilesPerTrigger", 1).parquet(str(inputs))
    return events.withWatermark("ts", "0 seconds")


def run_builtin(spark: SparkSession, work: Path, inputs: Path) -> tuple[float, int]:
    """Spark's windowed aggregation to the end of its input: wall time and windows written."""
    from pyspark.sql import functions as F

    out = Path(tempfile.mkdtemp(prefix="builtin-", dir=work))
    windows = (
        source(spark, inputs)
        .groupBy(F.window("ts", "5 minutes"), "user")
        .agg(F.count("*").alias("events"), F.sum("amount").alias("spent"))
    )

    seconds = _bench.run_spark_query(windows, out, "append")
    written = spark.read.parquet(str(out / "rows")).count() if (out / "rows").exists() else 0
    shutil.rmtree(out, ignore_errors=True)
    return seconds, written


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the comparison, print a table and a JSON line; return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    _bench.add_workload_arguments(parser)
    parser.set_defaults(records=1_000_000, keys=100_000)
    args = parser.parse_args(argv)
    spark = _bench.session(args.partitions)
    costs: dict[str, _costs.RunCosts] = {}
    written: dict[str, int] = {}
    with _bench.workdir(args.workdir) as work:
        inputs = generate(work / "input", args.records, args.keys, args.epochs)

        def run(variant: str) -> float:
            if variant not in ABS:
                seconds, written[variant] = run_builtin(spark, work, inputs)
                return seconds
            config = AbsConfig(key_groups=args.key_groups, **ABS[variant])
            result = _bench.run_pipeline(
                spark, work, variant, source(spark, inputs), WINDOWS, config
            )
            written[variant] = DeltaTable(str(result.root / "counts")).to_pyarrow_table().num_rows
            shutil.rmtree(result.root, ignore_errors=True)
            return result.seconds

        seconds = _bench.interleave(
            VARIANTS, args.repeats, _bench.measured(spark, costs, run), warm_up=args.warm_up
        )

    rate = {v: args.records / _bench.median(s) for v, s in seconds.items()}
    _bench.print_rates(args.records, seconds, "abs_async", costs, args.repeats)
    ratios = {f"abs_async_vs_{v}": round(rate["abs_async"] / rate[v], 3) for v in VARIANTS[:-1]}
    print(f"\nwindows written: {written}")
    for name, ratio in ratios.items():
        print(f"{name:<30} {ratio:6.3f}")
    figures = {
        **_bench.workload_figures(args),
        "records_per_s": {v: round(r) for v, r in rate.items()},
        "windows_written": written,
        **ratios,
        **_bench.cost_figures(costs, args.repeats),
        "seconds": {v: [round(x, 2) for x in s] for v, s in seconds.items()},
    }
    _bench.emit(figures)
    return figures


if __name__ == "__main__":
    main()
