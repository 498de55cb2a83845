"""Snapshot interval sweep (the ABS paper's Figure 6): runtime overhead against the interval.

Workload W (see ``_bench.py``), local[2]. Variants, interleaved, medians of the repeats:

* ``baseline``: ``AbsConfig(snapshots=False)``: outputs committed once per epoch, nothing
  snapshotted;
* ``abs_async_every_N`` and ``abs_sync_every_N`` for each interval N: pyspark-abs with
  ``snapshot_interval=N``, asynchronous and synchronous commit. Every epoch is still
  pre-committed (its changed state and outputs written as files) and PREPARED; the tables
  are committed once per group of N epochs (in the background with async);
* ``naiad_every_N`` for each interval N: a Naiad-style synchronous full snapshot,
  implemented in this script only. The pipeline runs with snapshots off (so its sink
  commit is synchronous: the next micro-batch waits for it), and at every N-th epoch the
  operator also emits the whole state of every key group it runs to a second Delta sink
  (``key, count, snapshot_epoch``). In workload W every key group receives records in every
  epoch (records per epoch / key groups >> 1), so that is the whole state; with sparser
  input it would not be.

The overhead of a variant is its median run time over the baseline's, minus one (and the
same for CPU time). The plot (``--plot``, default ``bench_intervals.png`` in the current
directory) shows overhead in percent against the interval. The last line printed is one
JSON object.

    python scripts/bench/bench_intervals.py [--records N] [--keys N] [--epochs N] [--repeats N]
        [--intervals 1,2,5,10] [--plot PATH]
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _bench
import _costs
import pandas as pd

from pyspark_abs import (
    AbsConfig,
    KeyGroupContext,
    KeyGroupResult,
    Operator,
    vectorized_operator,
)

_bench.pickle_by_value(__name__)

MODES = {"abs_async": "async", "abs_sync": "sync"}
LABELS = {
    "abs_async": "ABS async",
    "abs_sync": "ABS sync",
    "naiad": "Naiad-style sync full snapshot",
}


def naiad_keyed_count(interval: int) -> Operator:
    """The keyed count that also emits its whole state every ``interval`` epochs."""

    @vectorized_operator(
        key="key",
        state_schema="count long",
        outputs={
            "counts": "key long, count long",
            "snapshot": "key long, count long, snapshot_epoch long",
        },
        name="keyed_count",
    )
    def keyed_count(
        rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext
    ) -> KeyGroupResult:
        counts = _bench.count_keys(rows, state)
        outputs = {"counts": counts}
        if ctx.epoch is not None and (ctx.epoch + 1) % interval == 0:
            whole = pd.concat([state[["key", "count"]], counts]).drop_duplicates("key", keep="last")
            outputs["snapshot"] = whole.assign(snapshot_epoch=ctx.epoch)
        return KeyGroupResult(state=counts, output=outputs)

    return keyed_count


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the sweep, print a table and a JSON line, and return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    _bench.add_workload_arguments(parser)
    parser.add_argument("--intervals", default="1,2,5,10", help="epochs between snapshots")
    args = parser.parse_args(argv)
    intervals = [int(i) for i in args.intervals.split(",")]
    plot_path = args.plot or Path("bench_intervals.png")
    every = {f"{kind}_every_{n}": (kind, n) for kind in (*MODES, "naiad") for n in intervals}
    variants = ["baseline", *every]
    spark = _bench.session(args.partitions)
    costs: dict[str, _costs.RunCosts] = {}
    kept: list[Path] = []
    with _bench.workdir(args.workdir) as work:
        inputs = _bench.generate(work / "input", args.records, args.keys, args.epochs)

        def run(variant: str) -> float:
            source = _bench.parquet_source(spark, inputs)
            kind, n = every.get(variant, ("baseline", 1))
            if kind == "naiad":
                config = AbsConfig(key_groups=args.key_groups, snapshots=False)
                operator = naiad_keyed_count(n)
                result = _bench.run_pipeline(
                    spark, work, variant, source, operator, config, ("counts", "snapshot")
                )
            else:
                config = AbsConfig(
                    key_groups=args.key_groups,
                    snapshots=kind != "baseline",
                    commit_mode=MODES.get(kind, "async"),  # type: ignore[arg-type]
                    snapshot_interval=n,
                )
                result = _bench.run_pipeline(
                    spark, work, variant, source, _bench.keyed_count, config
                )
                if (kind, n) == ("abs_async", intervals[0]):
                    for earlier in kept:
                        shutil.rmtree(earlier, ignore_errors=True)
                    kept[:] = [result.root]  # its largest blob is measured after the runs
                    return result.seconds
            shutil.rmtree(result.root, ignore_errors=True)
            return result.seconds

        seconds = _bench.interleave(
            variants, args.repeats, _bench.measured(spark, costs, run), warm_up=args.warm_up
        )
        largest = _bench.largest_state_blob(kept[-1], "keyed_count")

    base = _bench.median(seconds["baseline"])
    overhead = {v: round(_bench.median(s) / base - 1, 3) for v, s in seconds.items()}
    spent = {v: _bench.median(c.measured_cpu(args.repeats)) for v, c in costs.items()}
    cpu_overhead = {v: round(spent[v] / spent["baseline"] - 1, 3) for v in variants}
    _bench.print_rates(args.records, seconds, "baseline", costs, args.repeats)
    print(f"\nruntime overhead vs baseline: {overhead}")
    print(f"CPU time overhead vs baseline: {cpu_overhead}")
    _bench.plot(
        plot_path,
        f"Snapshot interval sweep ({args.records:,} records, {args.keys:,} keys)",
        "snapshot interval (epochs)",
        "runtime overhead vs no snapshots (%)",
        {
            LABELS[kind]: [(n, 100 * overhead[f"{kind}_every_{n}"]) for n in intervals]
            for kind in LABELS
        },
        spreads={
            LABELS[kind]: [_spread(seconds[f"{kind}_every_{n}"], base) for n in intervals]
            for kind in LABELS
        },
        xticks=intervals,
    )
    figures = {
        **_bench.workload_figures(args),
        "intervals": intervals,
        "baseline_records_per_s": round(args.records / base),
        "records_per_s": {v: round(args.records / _bench.median(s)) for v, s in seconds.items()},
        "overhead": overhead,
        "cpu_overhead": cpu_overhead,
        "overhead_by_interval": {
            kind: {str(n): overhead[f"{kind}_every_{n}"] for n in intervals} for kind in LABELS
        },
        "largest_key_group_state": largest,
        **_bench.cost_figures(costs, args.repeats),
        "plot": str(plot_path),
        "seconds": {v: [round(x, 2) for x in s] for v, s in seconds.items()},
    }
    _bench.emit(figures)
    return figures


def _spread(runs: Sequence[float], base: float) -> tuple[float, float]:
    """The fastest and the slowest run's overhead in percent over ``base`` seconds."""
    return 100 * (min(runs) / base - 1), 100 * (max(runs) / base - 1)


if __name__ == "__main__":
    main()
