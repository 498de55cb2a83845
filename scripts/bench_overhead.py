"""What do ABS snapshots cost? A keyed count with snapshots off, synchronous and asynchronous.

Workload: RECORDS records over KEYS uniform keys, in EPOCHS epochs (one Parquet file each),
shuffle partitions 4, local[2]. Every variant runs the same vectorized operator on the same
source and writes the same output (the updated counts) to the same kind of Delta sink;
they differ only in what is snapshotted:

* baseline: ``AbsConfig(snapshots=False)``: outputs only, no state table, no manifest;
* sync: ABS, each micro-batch returns after its epoch is COMMITTED;
* async: ABS, each micro-batch returns after its epoch is PREPARED.

After one unmeasured run of each variant, variants are interleaved and repeated; the
medians are compared (``*_vs_baseline``), and so is each run with the baseline of its own
round (``paired_*``, the median of those ratios, which cancels slow drift). The last line
printed is one JSON object.

    python scripts/bench_overhead.py [--records N] [--keys N] [--epochs N] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pyspark_abs import (
    AbsConfig,
    KeyGroupContext,
    KeyGroupResult,
    Pipeline,
    Snapshots,
    local_session,
    vectorized_operator,
)

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "baseline": {"snapshots": False},
    "sync": {"commit_mode": "sync"},
    "async": {"commit_mode": "async"},
}


@vectorized_operator(key="key", state_schema="count long", output_schema="key long, count long")
def keyed_count(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Count records per key; emit the new count of every key seen in the epoch."""
    seen = rows["key"].value_counts()
    before = state.set_index("key")["count"].reindex(seen.index, fill_value=0)
    counts = (before + seen).rename("count").rename_axis("key").reset_index()
    return KeyGroupResult(state=counts, output=counts)


def generate(directory: Path, records: int, keys: int, epochs: int) -> None:
    """One Parquet file of uniform random keys per epoch."""
    rng = np.random.default_rng(1506)
    directory.mkdir(parents=True)
    per_epoch = records // epochs
    for epoch in range(epochs):
        table = pa.table({"key": pa.array(rng.integers(0, keys, per_epoch, dtype=np.int64))})
        pq.write_table(table, directory / f"epoch-{epoch:04d}.parquet")


def run(
    spark_dir: Path, input_dir: Path, variant: str, key_groups: int
) -> tuple[float, Path, dict[str, float]]:
    """Run one variant; return its wall time, snapshot root and Spark's per-epoch medians."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    assert spark is not None
    root = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=spark_dir))
    source = (
        spark.readStream.schema("key long").option("maxFilesPerTrigger", 1).parquet(str(input_dir))
    )
    config = AbsConfig(key_groups=key_groups, **VARIANTS[variant])  # type: ignore[arg-type]
    pipeline = Pipeline(
        "bench", source, keyed_count, root=str(root), sinks=str(root / "counts"), config=config
    )
    started = time.perf_counter()
    query = pipeline.run()
    elapsed = time.perf_counter() - started
    progress = [p for p in query.query.recentProgress if p.numInputRows]
    spark_ms = {
        phase: round(statistics.median(p.durationMs.get(phase, 0) for p in progress), 1)
        for phase in ("triggerExecution", "addBatch", "walCommit", "commitOffsets")
    }
    return elapsed, root, spark_ms


def breakdown(root: Path) -> dict[str, float]:
    """Median per-epoch protocol timings from the manifest (ABS variants only)."""
    infos = Snapshots(str(root)).list()[1:] or Snapshots(str(root)).list()
    fields = ("batch_ms", "precommit_ms", "align_ms", "prepare_ms", "commit_ms")
    return {f: round(statistics.median(getattr(i, f) or 0.0 for i in infos), 1) for f in fields}


def main() -> None:
    """Run the benchmark and print a table and a JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--key-groups", type=int, default=256)
    args = parser.parse_args()

    log_config = REPO / "conf" / "log4j2.properties"
    local_session(
        "pyspark-abs-bench",
        cores=2,
        shuffle_partitions=args.partitions,
        conf={
            "spark.driver.memory": "4g",
            "spark.driver.extraJavaOptions": f"-Xms4g -Dlog4j2.configurationFile={log_config}",
        },
    )
    work = Path(tempfile.mkdtemp(prefix="abs-bench-"))
    try:
        generate(work / "input", args.records, args.keys, args.epochs)
        # One unmeasured full-size run of each variant: the JVM and the Python workers
        # keep getting faster for minutes, which would otherwise favour later runs.
        for variant in VARIANTS:
            elapsed, root, _ = run(work, work / "input", variant, args.key_groups)
            print(f"warm-up  {variant:<8} {elapsed:7.1f} s", flush=True)
            shutil.rmtree(root, ignore_errors=True)
        seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
        timings: dict[str, dict[str, float]] = {}
        spark_timings: dict[str, dict[str, float]] = {}
        order = list(VARIANTS)
        for repeat in range(args.repeats):
            for variant in order[repeat % 3 :] + order[: repeat % 3]:
                elapsed, root, spark_timings[variant] = run(
                    work, work / "input", variant, args.key_groups
                )
                seconds[variant].append(elapsed)
                if variant != "baseline":
                    timings[variant] = breakdown(root)
                print(
                    f"repeat {repeat + 1} {variant:<8} {elapsed:7.1f} s "
                    f"{args.records / elapsed:>10,.0f} records/s",
                    flush=True,
                )
                shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rate = {v: args.records / statistics.median(s) for v, s in seconds.items()}
    paired = {
        v: round(statistics.median(b / x for b, x in zip(seconds["baseline"], s, strict=True)), 3)
        for v, s in seconds.items()
        if v != "baseline"
    }
    print(f"\n{'variant':<9} {'median s':>9} {'records/s':>11} {'vs baseline':>12}")
    for variant in VARIANTS:
        print(
            f"{variant:<9} {statistics.median(seconds[variant]):>9.1f} {rate[variant]:>11,.0f} "
            f"{rate[variant] / rate['baseline']:>12.3f}"
        )
    for variant, values in spark_timings.items():
        print(f"{variant} Spark per-epoch medians (ms): {values}")
    for variant, values in timings.items():
        print(f"{variant} protocol per-epoch medians (ms): {values}")
    print(
        json.dumps(
            {
                "records": args.records,
                "keys": args.keys,
                "epochs": args.epochs,
                "repeats": args.repeats,
                "partitions": args.partitions,
                "key_groups": args.key_groups,
                "baseline_records_per_s": round(rate["baseline"]),
                "sync_records_per_s": round(rate["sync"]),
                "async_records_per_s": round(rate["async"]),
                "async_vs_baseline": round(rate["async"] / rate["baseline"], 3),
                "sync_vs_baseline": round(rate["sync"] / rate["baseline"], 3),
                "paired_async_vs_baseline": paired["async"],
                "paired_sync_vs_baseline": paired["sync"],
                "seconds": {v: [round(x, 1) for x in s] for v, s in seconds.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
