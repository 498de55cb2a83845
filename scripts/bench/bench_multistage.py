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
Variants, interleaved:

* ``baseline``: both stages with ``snapshots=False``, independent queries;
* ``abs_async``: both snapshotted (asynchronous commit), independent queries as above;
* ``job``: the same two snapshotted stages as one :class:`~pyspark_abs.Job`: stage 2 reads
  stage 1's sink through a ``ChannelSource``, exactly one stage-1 epoch per micro-batch
  once stage 1 has committed it (barrier alignment), so epoch n of both stages is one
  consistent cut. Its latency per epoch is the time from stage 1's PREPARED of epoch n to
  stage 2's COMMITTED of n, from the manifests.

The last line printed is one JSON object.

    python scripts/bench/bench_multistage.py [--records N] [--keys N] [--epochs N] [--repeats N]
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
import _costs
import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    DeltaSource,
    Job,
    KeyGroupContext,
    KeyGroupResult,
    Pipeline,
    Snapshots,
    vectorized_operator,
)
from pyspark_abs.manifest.table import load_epoch_log
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore

_bench.pickle_by_value(__name__)

POLL = "1 second"
"""Stage 2's trigger interval: how often it looks for new stage-1 commits."""
VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {"snapshots": False},
    "abs_async": {"commit_mode": "async"},
    "job": {"commit_mode": "async"},
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
    costs: dict[str, _costs.RunCosts] = {}
    latencies: list[float] = []
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

            def select_bucket(df: DataFrame) -> DataFrame:
                return df.select((F.col("key") % args.buckets).alias("bucket"), "count")

            started = time.perf_counter()
            if variant == "job":
                second = Pipeline(
                    "bench-stage-2",
                    first.channel(),
                    bucket_stats,
                    root=str(roots[1]),
                    sinks=str(roots[1] / "buckets"),
                    config=config,
                    transform=select_bucket,
                )
                Job("bench", str(roots[0] / "job"), [first, second]).run()
                stage_seconds[variant]["1"].append(_stage_done(first.root) - started)
                latencies.extend(_latencies(first.root, second.root))
            else:
                upstream = first.start(available_now=True)  # creates the table stage 2 reads
                second = Pipeline(
                    "bench-stage-2",
                    DeltaSource(str(roots[0] / "counts"), max_files_per_trigger=args.partitions),
                    bucket_stats,
                    root=str(roots[1]),
                    sinks=str(roots[1] / "buckets"),
                    config=config,
                    transform=select_bucket,
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
    latency = round(_bench.median(latencies), 2) if latencies else None
    print(f"job: median seconds from stage 1 PREPARED to stage 2 COMMITTED per epoch: {latency}")
    figures = {
        **_bench.workload_figures(args),
        "buckets": args.buckets,
        "topology": "two concurrent pipelines connected through a Delta table: independent "
        "(DeltaSource) or one Job (ChannelSource)",
        "records_per_s": {v: round(r) for v, r in rate.items()},
        "async_vs_baseline": round(rate["abs_async"] / rate["baseline"], 3),
        "job_vs_independent": round(rate["job"] / rate["abs_async"], 3),
        "job_epoch_latency_s": latency,
        "stage_seconds": stages,
        **_bench.cost_figures(costs, args.repeats),
        "seconds": {v: [round(x, 2) for x in s] for v, s in seconds.items()},
    }
    _bench.emit(figures)
    return figures


def _stage_done(root: str) -> float:
    """When the root's newest epoch was committed, on the ``time.perf_counter`` clock."""
    latest = Snapshots(root).latest()
    assert latest is not None
    age = time.time() - latest.recorded_at.timestamp()
    return time.perf_counter() - age


def _latencies(upstream: str, downstream: str) -> list[float]:
    """Per epoch: seconds from the upstream stage's PREPARED to the downstream's COMMITTED."""
    store = DeltaStore()
    first = load_epoch_log(store, SnapshotRoot(upstream).manifest_uri)
    found = []
    for entry in load_epoch_log(store, SnapshotRoot(downstream).manifest_uri).snapshots():
        prepared = first.prepared(entry.epoch)
        if prepared is not None:
            found.append((entry.recorded_at - prepared.recorded_at).total_seconds())
    return found


if __name__ == "__main__":
    main()
