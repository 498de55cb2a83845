"""A two-stage topology: two shuffles, two stateful operators, both snapshotted every epoch.

A :class:`~pyspark_abs.Pipeline` runs one stateful operator, so the topology is two
pipelines connected through a Delta table:

1. ``counts``: workload W's keyed count (shuffle 1: records to the key groups of ``key``);
   its sink, the updated count of every key seen in an epoch, is a Delta table committed in
   each epoch's two-phase commit;
2. ``buckets``: reads that table with pyspark-abs's ``DeltaSource`` (about one stage-1
   epoch per micro-batch: as many files as stage 1 has partitions), and keeps, per bucket
   ``key % BUCKETS``, how many count updates it received and the largest count (shuffle 2:
   updates to the key groups of ``bucket``).

The stages run one after the other (stage 2 starts once stage 1 has processed its input),
so end-to-end records/s is input records over the sum of both stages' wall times. Variants:
``baseline`` (both stages with ``snapshots=False``) and ``abs_async`` (both snapshotted,
asynchronous commit), interleaved. The last line printed is one JSON object.

    python scripts/bench_multistage.py [--records N] [--keys N] [--epochs N] [--repeats N]
        [--buckets N]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _bench
import pandas as pd
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    DeltaSource,
    KeyGroupContext,
    KeyGroupResult,
    Pipeline,
    vectorized_operator,
)

_bench.pickle_by_value(__name__)

VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {"snapshots": False},
    "abs_async": {"commit_mode": "async"},
}


@vectorized_operator(
    key="bucket",
    state_schema="updates long, max_count long",
    output_schema="bucket long, updates long, max_count long",
)
def bucket_stats(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Per bucket: count updates received so far and the largest count seen."""
    seen = rows.groupby("bucket").agg(n=("count", "size"), top=("count", "max"))
    before = state.set_index("bucket").reindex(seen.index)
    updated = pd.DataFrame(
        {
            "updates": before["updates"].fillna(0).astype("int64") + seen["n"],
            "max_count": before["max_count"].fillna(0).astype("int64").combine(seen["top"], max),
        }
    ).reset_index()
    return KeyGroupResult(state=updated, output=updated)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run both stages per variant, print a table and a JSON line; return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    _bench.add_workload_arguments(parser)
    parser.add_argument("--buckets", type=int, default=10_000)
    args = parser.parse_args(argv)
    spark = _bench.session(args.partitions)
    stage_seconds: dict[str, dict[str, list[float]]] = {v: {"1": [], "2": []} for v in VARIANTS}
    costs: dict[str, _bench.RunCosts] = {}
    with _bench.workdir(args.workdir) as work:
        inputs = _bench.generate(work / "input", args.records, args.keys, args.epochs)

        def run(variant: str) -> float:
            config = AbsConfig(key_groups=args.key_groups, **VARIANTS[variant])
            source = _bench.parquet_source(spark, inputs)
            first = _bench.run_pipeline(
                spark, work, f"{variant}-1", source, _bench.keyed_count, config
            )
            root = Path(tempfile.mkdtemp(prefix=f"{variant}-2-", dir=work))
            second = Pipeline(
                "bench-stage-2",
                DeltaSource(str(first.root / "counts"), max_files_per_trigger=args.partitions),
                bucket_stats,
                root=str(root),
                sinks=str(root / "buckets"),
                config=config,
                transform=lambda df: df.select(
                    (F.col("key") % args.buckets).alias("bucket"), "count"
                ),
            )
            started = time.perf_counter()
            second.run()
            seconds = time.perf_counter() - started
            stage_seconds[variant]["1"].append(first.seconds)
            stage_seconds[variant]["2"].append(seconds)
            shutil.rmtree(first.root, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)
            return first.seconds + seconds

        seconds = _bench.interleave(
            list(VARIANTS), args.repeats, _bench.measured(spark, costs, run), warm_up=args.warm_up
        )

    _bench.print_rates(args.records, seconds, "baseline", costs, args.repeats)
    rate = {v: args.records / _bench.median(s) for v, s in seconds.items()}
    stages = {
        v: {stage: round(_bench.median(s[-args.repeats :]), 2) for stage, s in by_stage.items()}
        for v, by_stage in stage_seconds.items()
    }
    print(f"median seconds per stage: {stages}")
    figures = {
        "records": args.records,
        "keys": args.keys,
        "epochs": args.epochs,
        "repeats": args.repeats,
        "partitions": args.partitions,
        "key_groups": args.key_groups,
        "buckets": args.buckets,
        "topology": "two pipelines connected through a Delta table (DeltaSource)",
        "records_per_s": {v: round(r) for v, r in rate.items()},
        "async_vs_baseline": round(rate["abs_async"] / rate["baseline"], 3),
        "stage_seconds": stages,
        **_bench.cost_figures(costs, args.repeats),
        "seconds": {v: [round(x, 2) for x in s] for v, s in seconds.items()},
    }
    _bench.emit(figures)
    return figures


if __name__ == "__main__":
    main()
