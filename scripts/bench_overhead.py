"""What do ABS snapshots cost? A keyed count with snapshots off, synchronous and asynchronous.

Workload W (see ``_bench.py``): RECORDS records over KEYS uniform keys, in EPOCHS epochs (one
Parquet file each), shuffle partitions 4, local[2]. Every variant runs the same vectorized
operator on the same source and writes the same output (the updated counts) to the same kind
of Delta sink; they differ only in what is snapshotted:

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
import shutil
from collections.abc import Sequence
from typing import Any

import _bench

from pyspark_abs import AbsConfig

VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {"snapshots": False},
    "sync": {"commit_mode": "sync"},
    "async": {"commit_mode": "async"},
}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print a table and a JSON line, and return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    _bench.add_workload_arguments(parser)
    args = parser.parse_args(argv)
    spark = _bench.session(args.partitions)
    timings: dict[str, dict[str, float]] = {}
    spark_timings: dict[str, dict[str, float]] = {}
    with _bench.workdir(args.workdir) as work:
        inputs = _bench.generate(work / "input", args.records, args.keys, args.epochs)

        def run(variant: str) -> float:
            config = AbsConfig(key_groups=args.key_groups, **VARIANTS[variant])
            source = _bench.parquet_source(spark, inputs)
            result = _bench.run_pipeline(spark, work, variant, source, _bench.keyed_count, config)
            spark_timings[variant] = result.spark_ms
            if variant != "baseline":
                timings[variant] = _bench.protocol_medians(result.root)
            shutil.rmtree(result.root, ignore_errors=True)
            return result.seconds

        seconds = _bench.interleave(list(VARIANTS), args.repeats, run, warm_up=args.warm_up)

    rate = {v: args.records / _bench.median(s) for v, s in seconds.items()}
    _bench.print_rates(args.records, seconds, "baseline")
    for variant, values in spark_timings.items():
        print(f"{variant} Spark per-epoch medians (ms): {values}")
    for variant, values in timings.items():
        print(f"{variant} protocol per-epoch medians (ms): {values}")
    figures = {
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
        "paired_async_vs_baseline": _bench.paired_ratio(seconds["baseline"], seconds["async"]),
        "paired_sync_vs_baseline": _bench.paired_ratio(seconds["baseline"], seconds["sync"]),
        "seconds": {v: [round(x, 1) for x in s] for v, s in seconds.items()},
    }
    _bench.emit(figures)
    return figures


if __name__ == "__main__":
    main()
