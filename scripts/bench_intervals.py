"""Snapshot interval sweep (the ABS paper's Figure 6): runtime overhead against the interval.

Workload W (see ``_bench.py``), local[2]. Variants, interleaved, medians of the repeats:

* ``baseline``: ``AbsConfig(snapshots=False)``: outputs committed once per epoch, nothing
  snapshotted;
* ``abs_async`` and ``abs_sync``: pyspark-abs snapshots, asynchronous and synchronous
  commit. pyspark-abs snapshots every epoch and has no snapshot interval yet (see the
  report on issue 7: a correct interval needs every key group with changes since the last
  snapshot to run at the snapshot epoch, which ``applyInPandasWithState`` does not offer),
  so these are measured at interval 1 only and plotted as single points;
* ``naiad_every_N`` for each interval N: a Naiad-style synchronous full snapshot,
  implemented in this script only. The pipeline runs with snapshots off (so its sink
  commit is synchronous: the next micro-batch waits for it), and at every N-th epoch the
  operator also emits the whole state of every key group it runs to a second Delta sink
  (``key, count, snapshot_epoch``). In workload W every key group receives records in every
  epoch (records per epoch / key groups >> 1), so that is the whole state; with sparser
  input it would not be.

The overhead of a variant is its median run time over the baseline's, minus one. The plot
(``--plot``, default ``bench_intervals.png`` in the current directory) shows overhead in
percent against the interval. The last line printed is one JSON object.

    python scripts/bench_intervals.py [--records N] [--keys N] [--epochs N] [--repeats N]
        [--intervals 1,2,5,10] [--plot PATH]
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _bench
import pandas as pd

from pyspark_abs import (
    AbsConfig,
    KeyGroupContext,
    KeyGroupResult,
    Operator,
    vectorized_operator,
)

_bench.pickle_by_value(__name__)

ABS = {"abs_async": "async", "abs_sync": "sync"}


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
    naiad = {f"naiad_every_{n}": n for n in intervals}
    variants = ["baseline", *ABS, *naiad]
    spark = _bench.session(args.partitions)
    costs: dict[str, _bench.RunCosts] = {}
    largest: dict[str, int] = {}
    with _bench.workdir(args.workdir) as work:
        inputs = _bench.generate(work / "input", args.records, args.keys, args.epochs)

        def run(variant: str) -> float:
            source = _bench.parquet_source(spark, inputs)
            if variant in naiad:
                config = AbsConfig(key_groups=args.key_groups, snapshots=False)
                operator = naiad_keyed_count(naiad[variant])
                result = _bench.run_pipeline(
                    spark, work, variant, source, operator, config, ("counts", "snapshot")
                )
            else:
                config = AbsConfig(
                    key_groups=args.key_groups,
                    snapshots=variant != "baseline",
                    commit_mode=ABS.get(variant, "async"),  # type: ignore[arg-type]
                )
                result = _bench.run_pipeline(
                    spark, work, variant, source, _bench.keyed_count, config
                )
                if variant == "abs_async":
                    largest.update(_bench.largest_state_blob(result.root, "keyed_count"))
            shutil.rmtree(result.root, ignore_errors=True)
            return result.seconds

        seconds = _bench.interleave(
            variants, args.repeats, _bench.measured(spark, costs, run), warm_up=args.warm_up
        )

    base = _bench.median(seconds["baseline"])
    overhead = {v: round(_bench.median(s) / base - 1, 3) for v, s in seconds.items()}
    _bench.print_rates(args.records, seconds, "baseline", costs, args.repeats)
    print(f"\nruntime overhead vs baseline: {overhead}")
    _bench.plot(
        plot_path,
        f"Snapshot interval sweep ({args.records:,} records, {args.keys:,} keys)",
        "snapshot interval (epochs)",
        "runtime overhead vs no snapshots (%)",
        {
            "Naiad-style sync full snapshot": [(n, 100 * overhead[v]) for v, n in naiad.items()],
            "ABS async (every epoch)": [(1, 100 * overhead["abs_async"])],
            "ABS sync (every epoch)": [(1, 100 * overhead["abs_sync"])],
        },
        xticks=intervals,
    )
    figures = {
        "records": args.records,
        "keys": args.keys,
        "epochs": args.epochs,
        "repeats": args.repeats,
        "partitions": args.partitions,
        "key_groups": args.key_groups,
        "intervals": intervals,
        "baseline_records_per_s": round(args.records / base),
        "records_per_s": {v: round(args.records / _bench.median(s)) for v, s in seconds.items()},
        "overhead": overhead,
        "naiad_overhead_by_interval": {str(n): overhead[v] for v, n in naiad.items()},
        "largest_key_group_state": largest,
        **_bench.cost_figures(costs, args.repeats),
        "plot": str(plot_path),
        "seconds": {v: [round(x, 2) for x in s] for v, s in seconds.items()},
    }
    _bench.emit(figures)
    return figures


if __name__ == "__main__":
    main()
