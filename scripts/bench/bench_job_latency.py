"""End-to-end latency through a three-stage job on a trickle, against its stages' epoch times.

The trickle of ``bench_latency.py`` (one small Parquet file of random keys lands every
INTERVAL seconds, one file per micro-batch) feeds a :class:`~pyspark_abs.Job` of three
stages joined by channels:

* ``count``: workload W's keyed count of the landed files (``_bench.keyed_count``);
* ``relay`` and ``last``: each reads the stage before's channel and passes on every key's
  count when it grew (state: the newest count per key).

Every stage's sink holds ``(key, count)`` rows, so a file is visible at a stage once a
version of that stage's sink counts every record up to the file (see
``bench_latency.visible_times_from_delta``, which reads the sinks with deltalake). Latency is
a file's landing to that commit, at each stage; epoch time is each stage's median Spark
``triggerExecution`` of the micro-batches that read input. The target of a pipelined job is
a p50 latency at the last stage of at most 1.5x the sum of the stages' epoch times. The job
first runs once over one file with ``availableNow``, which is not measured; then it starts,
every stage at once, and the trickle begins. The first file after the start is also reported
alone: it would pay a stage's start-up if a stage waited for it. Before the trickle, the job
waits for its first file for IDLE seconds: the cores it takes meanwhile (driver, JVM and
Python workers) are reported beside those of as many Spark streaming queries waiting on an
empty directory. Variants (the stages' commit mode) are interleaved; the last line printed
is one JSON object.

    python scripts/bench/bench_job_latency.py [--files N] [--interval S] [--records-per-file N]
        [--keys N] [--key-groups K] [--repeats N] [--idle-seconds IDLE]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import _bench
import bench_latency
import numpy as np
import pandas as pd
from _costs import CostSampler

from pyspark_abs import AbsConfig, Job, KeyGroupContext, KeyGroupResult, Pipeline
from pyspark_abs import vectorized_operator as vectorized

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_bench.pickle_by_value(__name__)

STAGES = ["count", "relay", "last"]
VARIANTS: dict[str, Literal["sync", "async"]] = {"job_async": "async", "job_sync": "sync"}
UNMEASURED = 1
"""Files landed before the measured ones: the first run's."""
TARGET = 1.5
"""The last stage's p50 latency at most this many times the sum of the stages' epoch times."""


@vectorized(key="key", state_schema="count long", output_schema="key long, count long")
def newest_count(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Pass on each key's newest count when it is above the count the state holds."""
    keys = rows["key"].to_numpy()
    counts = rows["count"].to_numpy()
    order = np.lexsort((counts, keys))
    last = np.r_[keys[order][1:] != keys[order][:-1], True]
    keys, counts = keys[order][last], counts[order][last]
    held = _bench.held_counts(keys, state, missing=-1)
    grown = pd.DataFrame({"key": keys, "count": counts})[counts > held]
    return KeyGroupResult(state=grown, output=grown)


def job_over(spark: SparkSession, work: Path, landing: Path, config: AbsConfig) -> Job:
    """The three stages over ``landing``, roots and sinks under ``work``."""
    stages = [
        Pipeline(
            "count",
            _bench.parquet_source(spark, landing),
            _bench.keyed_count,
            root=str(work / "count"),
            sinks=str(work / "sinks" / "count"),
            config=config,
        )
    ]
    for name in STAGES[1:]:
        stages.append(
            Pipeline(
                name,
                stages[-1].channel(),
                newest_count,
                root=str(work / name),
                sinks=str(work / "sinks" / name),
                config=config,
            )
        )
    return Job("latency", str(work / "job"), stages)


def run_job(
    spark: SparkSession,
    work: Path,
    trickle: bench_latency.Trickle,
    interval: float,
    config: AbsConfig,
    idle_s: float,
) -> tuple[dict[str, list[float]], dict[str, list[float]], float]:
    """Run the job over the trickle: each stage's epoch times, when each measured file
    became visible at each stage, and the cores the job took waiting for the first one."""

    def land_one() -> None:
        first = sorted(trickle.staged.iterdir())[0]
        first.rename(trickle.landing / first.name)

    sinks = {stage: str(work / "sinks" / stage) for stage in STAGES}
    land_one()
    job_over(spark, work, trickle.landing, config).run()
    query = job_over(spark, work, trickle.landing, config).start()
    try:
        for stage in STAGES:
            bench_latency.waiting_for_data(query.stages[stage].query)
        idle = idle_cores(spark, idle_s)
        trickle.land_all(interval)
        bench_latency.wait_until(
            lambda: bench_latency.shown_total(sinks["last"]) >= trickle.totals[-1],
            "the last file at the last stage",
        )
    finally:
        query.stop()
    for stage, sink in sinks.items():
        shown = bench_latency.shown_total(sink)
        if shown != trickle.totals[-1]:
            raise SystemExit(
                f"stage {stage}'s sink counts {shown} records, but {trickle.totals[-1]} landed"
            )
    epochs = {s: bench_latency.epoch_ms(query.stages[s].query) for s in STAGES}
    visible = {s: bench_latency.visible_times_from_delta(sinks[s], trickle.totals) for s in STAGES}
    return epochs, {s: times[UNMEASURED:] for s, times in visible.items()}, idle


def idle_cores(spark: SparkSession, seconds: float) -> float:
    """The cores the session's application (driver, JVM, Python workers) takes over
    ``seconds`` in which it is left alone."""
    started = time.perf_counter()
    with CostSampler([_bench.jvm_pid(spark)]) as sampler:
        time.sleep(seconds)
    return sampler.costs.cpu_seconds[-1] / (time.perf_counter() - started)


def spark_idle_cores(spark: SparkSession, work: Path, seconds: float) -> float:
    """:func:`idle_cores` of one Spark streaming query per stage (a count over a text
    directory, to memory) waiting for its first file."""
    empty = work / "spark-idle" / "in"
    empty.mkdir(parents=True)
    queries = [
        spark.readStream.text(str(empty))
        .groupBy("value")
        .count()
        .writeStream.outputMode("complete")
        .format("memory")
        .queryName(f"idle_{stage}")
        .option("checkpointLocation", str(work / "spark-idle" / stage))
        .start()
        for stage in STAGES
    ]
    try:
        for query in queries:
            bench_latency.waiting_for_data(query)
        return idle_cores(spark, seconds)
    finally:
        for query in queries:
            query.stop()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the job over a trickle in each commit mode; print a table and a JSON line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    bench_latency.add_trickle_arguments(parser, interval=2.0)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    spark = _bench.session(args.partitions)
    epochs: dict[str, dict[str, list[float]]] = {v: {s: [] for s in STAGES} for v in VARIANTS}
    latencies: dict[str, dict[str, list[float]]] = {v: {s: [] for s in STAGES} for v in VARIANTS}
    first_files: dict[str, list[float]] = {v: [] for v in VARIANTS}
    idle: dict[str, list[float]] = {v: [] for v in [*VARIANTS, "spark"]}
    with _bench.workdir(args.workdir) as work:
        runs = 0

        def run(variant: str, keep: bool) -> float:
            nonlocal runs
            runs += 1
            scratch = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=work))
            files = args.files + UNMEASURED
            trickle = bench_latency.Trickle(scratch, files, args.records_per_file, args.keys, runs)
            config = AbsConfig(key_groups=args.key_groups, commit_mode=VARIANTS[variant])
            started = time.perf_counter()
            stage_epochs, visible, job_idle = run_job(
                spark, scratch, trickle, args.interval, config, args.idle_seconds
            )
            seconds = time.perf_counter() - started
            if keep:
                for stage in STAGES:
                    epochs[variant][stage] += stage_epochs[stage]
                    latencies[variant][stage] += [
                        1000 * (v - t)
                        for v, t in zip(visible[stage], trickle.landed_at, strict=True)
                    ]
                first_files[variant].append(1000 * (visible["last"][0] - trickle.landed_at[0]))
                idle[variant].append(job_idle)
                idle["spark"].append(spark_idle_cores(spark, scratch, args.idle_seconds))
            shutil.rmtree(scratch, ignore_errors=True)
            return seconds

        if args.warm_up:
            for variant in VARIANTS:
                print(f"warm-up  {variant:<10} {run(variant, False):7.1f} s")
        _bench.interleave(list(VARIANTS), args.repeats, lambda v: run(v, True), warm_up=False)

    figures_by_variant: dict[str, Any] = {}
    for variant in VARIANTS:
        medians = {s: round(statistics.median(epochs[variant][s]), 1) for s in STAGES}
        p50 = {s: bench_latency.percentile(latencies[variant][s], 50) for s in STAGES}
        p99 = {s: bench_latency.percentile(latencies[variant][s], 99) for s in STAGES}
        summed = round(sum(medians.values()), 1)
        figures_by_variant[variant] = {
            "epoch_ms_median": medians,
            "epoch_ms_sum": summed,
            "latency_ms_p50": p50,
            "latency_ms_p99": p99,
            "last_p50_vs_epoch_sum": round(p50["last"] / summed, 3),
            "first_file_at_last_ms_median": round(statistics.median(first_files[variant]), 1),
            "idle_cores_median": round(statistics.median(idle[variant]), 3),
            "files": len(latencies[variant]["last"]),
        }
    header = " ".join(f"{s + ' ms':>10}" for s in STAGES)
    print(f"\n{'variant':<10} epoch {header}  | latency p50 {header}  | p50 / sum  | first file")
    for variant, f in figures_by_variant.items():
        stage_epochs = " ".join(f"{f['epoch_ms_median'][s]:>10.1f}" for s in STAGES)
        stage_p50 = " ".join(f"{f['latency_ms_p50'][s]:>10.1f}" for s in STAGES)
        ratio = f["last_p50_vs_epoch_sum"]
        verdict = "meets" if ratio <= TARGET else "MISSES"
        print(
            f"{variant:<10}       {stage_epochs}  |             {stage_p50}  | {ratio:.3f} "
            f"{verdict} <= {TARGET}  | {f['first_file_at_last_ms_median']:>7.1f} ms"
        )
    spark_idle = round(statistics.median(idle["spark"]), 3)
    print(
        f"waiting for data: the job takes {figures_by_variant['job_async']['idle_cores_median']}"
        f" cores (async), {len(STAGES)} Spark streaming queries {spark_idle}"
    )
    figures = {
        **bench_latency.trickle_settings(args),
        "idle_seconds": args.idle_seconds,
        "spark_idle_cores_median": spark_idle,
        "variants": figures_by_variant,
        "target_last_p50_vs_epoch_sum": TARGET,
        "targets_met": figures_by_variant["job_async"]["last_p50_vs_epoch_sum"] <= TARGET,
    }
    _bench.emit(figures)
    return figures


if __name__ == "__main__":
    main()
