"""The fixed cost of a small epoch: epoch time and end-to-end latency on a trickle, four ways.

A trickle: one small Parquet file of RECORDS_PER_FILE random keys (out of KEYS) lands every
INTERVAL seconds while the query runs (processing-time trigger, as fast as possible), one
file per micro-batch. Each variant counts records per key, as workload W (``_bench.py``):

* ``builtin_default``: ``groupBy("key").count()``, Spark's default state store, each
  micro-batch's updated counts appended as Parquet from ``foreachBatch``;
* ``abs_baseline``: pyspark-abs with ``snapshots=False`` (outputs committed to Delta);
* ``abs_sync`` and ``abs_async``: pyspark-abs snapshotting every epoch.

Latency is a file's landing (the rename that makes it visible to the source) to the moment
its records are visible downstream: for the pyspark-abs variants the Delta commit of the sink
version whose counts first include the whole file (from the commit timestamps in the sink's
own log, reading each version with deltalake, not with pyspark-abs); for Spark's aggregation
the end of the ``foreachBatch`` that appended the file's micro-batch. Epoch time is Spark's
median ``triggerExecution`` of the micro-batches that read input. Variants are interleaved;
the last line printed is one JSON object.

    python scripts/bench/bench_latency.py [--files N] [--interval S] [--records-per-file N]
        [--keys N] [--key-groups K] [--repeats N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _bench
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from pyspark_abs import AbsConfig, Pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

_bench.pickle_by_value(__name__)

ABS: dict[str, dict[str, Any]] = {
    "abs_baseline": {"snapshots": False},
    "abs_sync": {"commit_mode": "sync"},
    "abs_async": {"commit_mode": "async"},
}
VARIANTS = ["builtin_default", *ABS]
TARGETS = {"abs_baseline": 1.1, "builtin_default": 1.0}
"""abs_async's median epoch time at most this many times the variant's."""
WAIT_S = 120.0


class Trickle:
    """The files of one run: written ahead, landed one by one; their landing times."""

    def __init__(self, work: Path, files: int, records: int, keys: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.staged = work / "staged"
        self.landing = work / "landing"
        self.staged.mkdir(parents=True)
        self.landing.mkdir()
        self.totals: list[int] = []
        for index in range(files):
            table = pa.table({"key": pa.array(rng.integers(0, keys, records, dtype=np.int64))})
            pq.write_table(table, self.staged / f"file-{index:05d}.parquet")
            self.totals.append(records * (index + 1))
        self.landed_at: list[float] = []

    def land_all(self, interval: float) -> None:
        """Rename each file into the landing folder, ``interval`` seconds apart."""
        for path in sorted(self.staged.iterdir()):
            due = (self.landed_at[-1] + interval) if self.landed_at else time.time()
            time.sleep(max(0.0, due - time.time()))
            path.rename(self.landing / path.name)
            self.landed_at.append(time.time())


def shown_total(sink: str, version: int | None = None) -> int:
    """How many records a version of the sink counts (see :func:`_bench.records_counted`)."""
    rows = DeltaTable(sink, version=version).to_pyarrow_table(columns=["key", "count"])
    return _bench.records_counted(rows)


def visible_times_from_delta(sink: str, totals: Sequence[int]) -> list[float]:
    """When each file's records became visible: the commit of the first sink version
    that counts them all."""
    stamps = {int(h["version"]): int(h["timestamp"]) / 1000 for h in DeltaTable(sink).history()}
    visible: list[float] = []
    for version in sorted(stamps):
        shown = shown_total(sink, version)
        while len(visible) < len(totals) and totals[len(visible)] <= shown:
            visible.append(stamps[version])
    return visible


def wait_until(done: Callable[[], bool], what: str) -> None:
    deadline = time.time() + WAIT_S
    while not done():
        if time.time() > deadline:
            raise SystemExit(f"{what} did not come within {WAIT_S} s")
        time.sleep(0.05)


def waiting_for_data(query: StreamingQuery) -> None:
    """Wait until the query has started and polls for input: the start is no latency."""
    wait_until(lambda: query.status["message"] == "Waiting for data to arrive", "the start")


def run_builtin(
    spark: SparkSession, work: Path, trickle: Trickle, interval: float
) -> tuple[StreamingQuery, list[float]]:
    """Spark's own count over the trickle; when each file's micro-batch was appended."""
    ended: dict[int, float] = {}
    out = work / "counts"

    def append(batch: DataFrame, batch_id: int) -> None:
        batch.write.mode("append").parquet(str(out))
        ended[batch_id] = time.time()

    query = (
        _bench.parquet_source(spark, trickle.landing)
        .groupBy("key")
        .count()
        .writeStream.outputMode("update")
        .foreachBatch(append)
        .option("checkpointLocation", str(work / "_checkpoint"))
        .start()
    )
    try:
        waiting_for_data(query)
        trickle.land_all(interval)
        wait_until(lambda: len(ended) >= len(trickle.totals), "the last micro-batch")
    finally:
        query.stop()
    return query, [ended[b] for b in range(len(trickle.totals))]


def run_abs(
    spark: SparkSession, work: Path, trickle: Trickle, interval: float, config: AbsConfig
) -> tuple[StreamingQuery, list[float]]:
    """pyspark-abs over the trickle; when each file became visible in the sink."""
    sink = str(work / "counts")
    pipeline = Pipeline(
        "latency",
        _bench.parquet_source(spark, trickle.landing),
        _bench.keyed_count,
        root=str(work / "root"),
        sinks=sink,
        config=config,
    )
    query = pipeline.start()

    def all_visible() -> bool:
        try:
            return shown_total(sink) >= trickle.totals[-1]
        except TableNotFoundError:  # the sink is created with the first epoch
            return False

    try:
        waiting_for_data(query.query)
        trickle.land_all(interval)
        wait_until(all_visible, "the last file")
    finally:
        query.stop()
    return query.query, visible_times_from_delta(sink, trickle.totals)


def epoch_ms(query: StreamingQuery) -> list[float]:
    return [float(p.durationMs["triggerExecution"]) for p in query.recentProgress if p.numInputRows]


def percentile(values: Sequence[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(values), q)), 1)


def add_trickle_arguments(parser: argparse.ArgumentParser, *, interval: float) -> None:
    """The options of a trickle benchmark; ``interval`` is the default seconds between files."""
    parser.add_argument("--files", type=int, default=30)
    parser.add_argument("--interval", type=float, default=interval, help="seconds between files")
    parser.add_argument("--records-per-file", type=int, default=200)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--key-groups", type=int, default=256)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false")
    parser.add_argument("--workdir", type=Path, help="directory for tables (default: temporary)")


def trickle_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The options of :func:`add_trickle_arguments` as the figures report them."""
    return {
        "files": args.files,
        "interval_s": args.interval,
        "records_per_file": args.records_per_file,
        "keys": args.keys,
        "key_groups": args.key_groups,
        "partitions": args.partitions,
        "repeats": args.repeats,
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the trickle four ways, print a table and a JSON line; return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_trickle_arguments(parser, interval=1.0)
    args = parser.parse_args(argv)
    spark = _bench.session(args.partitions)
    latencies: dict[str, list[float]] = {v: [] for v in VARIANTS}
    epochs: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with _bench.workdir(args.workdir) as work:
        runs = 0

        def run(variant: str, keep: bool) -> float:
            nonlocal runs
            runs += 1
            scratch = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=work))
            trickle = Trickle(scratch, args.files, args.records_per_file, args.keys, runs)
            started = time.perf_counter()
            if variant in ABS:
                config = AbsConfig(key_groups=args.key_groups, **ABS[variant])
                query, visible = run_abs(spark, scratch, trickle, args.interval, config)
            else:
                query, visible = run_builtin(spark, scratch, trickle, args.interval)
            seconds = time.perf_counter() - started
            if keep:
                latencies[variant] += [
                    1000 * (v - t) for v, t in zip(visible, trickle.landed_at, strict=True)
                ]
                epochs[variant] += epoch_ms(query)
            shutil.rmtree(scratch, ignore_errors=True)
            return seconds

        if args.warm_up:
            for variant in VARIANTS:
                print(f"warm-up  {variant:<16} {run(variant, False):7.1f} s")
        _bench.interleave(VARIANTS, args.repeats, lambda v: run(v, True), warm_up=False)

    figures_by_variant = {
        v: {
            "epoch_ms_median": round(statistics.median(epochs[v]), 1),
            "latency_ms_p50": percentile(latencies[v], 50),
            "latency_ms_p99": percentile(latencies[v], 99),
            "files": len(latencies[v]),
        }
        for v in VARIANTS
    }
    print(f"\n{'variant':<16} {'epoch ms':>9} {'latency p50 ms':>15} {'p99 ms':>8}")
    for variant, f in figures_by_variant.items():
        print(
            f"{variant:<16} {f['epoch_ms_median']:>9.1f} {f['latency_ms_p50']:>15.1f} "
            f"{f['latency_ms_p99']:>8.1f}"
        )
    mine = figures_by_variant["abs_async"]
    ratios = {
        f"abs_async_vs_{v}": {
            "epoch": round(mine["epoch_ms_median"] / figures_by_variant[v]["epoch_ms_median"], 3),
            "latency_p50": round(
                mine["latency_ms_p50"] / figures_by_variant[v]["latency_ms_p50"], 3
            ),
        }
        for v in VARIANTS[:-1]
    }
    print("\nabs_async's epoch time relative to (latency p50 in brackets):")
    for reference, target in TARGETS.items():
        ratio = ratios[f"abs_async_vs_{reference}"]
        verdict = "meets" if ratio["epoch"] <= target else "MISSES"
        print(
            f"  {reference:<16} {ratio['epoch']:6.3f} ({ratio['latency_p50']:.3f})  "
            f"{verdict} <= {target}"
        )
    figures = {
        **trickle_settings(args),
        "variants": figures_by_variant,
        "ratios": ratios,
        "targets": {f"abs_async_vs_{v}": t for v, t in TARGETS.items()},
        "targets_met": all(ratios[f"abs_async_vs_{v}"]["epoch"] <= t for v, t in TARGETS.items()),
    }
    _bench.emit(figures)
    return figures


if __name__ == "__main__":
    main()
