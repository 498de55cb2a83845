"""A two-stage topology: two shuffles, two stateful operators, both snapshotted every epoch.

A :class:`~pyspark_abs.Pipeline` runs one stateful operator, so the topology is two
pipelines, two streaming queries running at the same time, connected through a Delta table
(DESIGN.md's "pipelines of several queries"):

1. ``counts``: workload W's keyed count (shuffle 1: records to the key groups of ``key``);
   its sink, the updated count of every key seen in an epoch, is a Delta table committed in
   each epoch's two-phase commit;
2. ``buckets``: reads that table with pyspark-abs's ``DeltaSource`` while stage 1 writes
   it (at most one stage-1 epoch per micro-batch: as many files as stage 1 has
   partitions), and keeps, per bucket ``key % BUCKETS``, how many count updates it
   received and the largest count (shuffle 2: updates to the key groups of ``bucket``).

Stage 1 processes the input while stage 2 polls its table every second; then stage 2
finishes what stage 1 committed. End-to-end records/s is input records over that wall
time. Each stage's snapshot records the offsets it consumed, so stage 2's snapshot at
epoch n together with stage 1's at the table version stage 2 read is a consistent cut of
the whole topology.
Variants: ``baseline`` (both stages with ``snapshots=False``) and ``abs_async`` (both
snapshotted, asynchronous commit), interleaved. The last line printed is one JSON object.

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

POLL = "1 second"
"""Stage 2's trigger interval: how often it looks for new stage-1 commits."""
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
            roots = [Path(tempfile.mkdtemp(prefix=f"{variant}-{n}-", dir=work)) for n in (1, 2)]
            first = Pipeline(
                "bench-stage-1",
                _bench.parquet_source(spark, inputs),
                _bench.keyed_count,
                root=str(roots[0]),
                sinks=str(roots[0] / "counts"),
                config=config,
            )
            started = time.perf_counter()
            upstream = first.start(available_now=True)  # creates the table stage 2 reads
            second = Pipeline(
                "bench-stage-2",
                DeltaSource(str(roots[0] / "counts"), max_files_per_trigger=args.partitions),
                bucket_stats,
                root=str(roots[1]),
                sinks=str(roots[1] / "buckets"),
                config=config,
                transform=lambda df: df.select(
                    (F.col("key") % args.buckets).alias("bucket"), "count"
                ),
            )
            downstream = second.start(processing_time=POLL)
            try:
                upstream.await_termination()
                stage_seconds[variant]["1"].append(time.perf_counter() - started)
                downstream.process_all_available()
            finally:
                downstream.stop()
            seconds = time.perf_counter() - started
            stage_seconds[variant]["2"].append(seconds)
            for root in roots:
                shutil.rmtree(root, ignore_errors=True)
            return seconds

        seconds = _bench.interleave(
            list(VARIANTS), args.repeats, _bench.measured(spark, costs, run), warm_up=args.warm_up
        )

    _bench.print_rates(args.records, seconds, "baseline", costs, args.repeats)
    rate = {v: args.records / _bench.median(s) for v, s in seconds.items()}
    stages = {
        v: {stage: round(_bench.median(s[-args.repeats :]), 2) for stage, s in by_stage.items()}
        for v, by_stage in stage_seconds.items()
    }
    print(f"median seconds until each stage was done: {stages}")
    figures = {
        "records": args.records,
        "keys": args.keys,
        "epochs": args.epochs,
        "repeats": args.repeats,
        "partitions": args.partitions,
        "key_groups": args.key_groups,
        "buckets": args.buckets,
        "topology": "two concurrent pipelines connected through a Delta table (DeltaSource)",
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
