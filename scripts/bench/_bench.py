"""What the benchmark scripts share: the keyed-count workload, sessions, runs and reports.

Workload W: RECORDS records over KEYS uniform random keys in EPOCHS epochs, one Parquet file
per epoch, read one file per micro-batch; the operator counts records per key and emits the
new count of every key it saw (:data:`keyed_count`). Each script interleaves its variants
after one unmeasured warm-up run of each (the JVM and the Python workers keep getting faster
for minutes, which would otherwise favour later runs) and compares medians. Scripts print a
table, then one JSON object as their last line.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from _costs import CostSampler, RunCosts

from pyspark_abs import (
    AbsConfig,
    ArrowContext,
    KeyGroupContext,
    KeyGroupResult,
    Operator,
    Pipeline,
    Snapshots,
    arrow_operator,
    local_session,
    vectorized_operator,
)
from pyspark_abs.operators.schema import EPOCH, KEY_GROUP
from pyspark_abs.operators.state_codec import BatchCodec

if TYPE_CHECKING:
    import argparse

    from pyspark.sql import DataFrame, SparkSession

REPO = Path(__file__).resolve().parents[2]
ROCKSDB = {
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}
"""Spark's RocksDB state store with changelog checkpointing: the store to beat."""


def pickle_by_value(module_name: str) -> None:
    """Ship a script module's functions to Spark's Python workers by value.

    The workers cannot import ``scripts/`` modules, and a module that is not ``__main__``
    (imported by another script or a test) would otherwise be pickled by reference.
    """
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[module_name])  # type: ignore[no-untyped-call]


pickle_by_value(__name__)
pickle_by_value("_costs")


@vectorized_operator(key="key", state_schema="count long", output_schema="key long, count long")
def keyed_count(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """Count records per key; emit the new count of every key seen in the epoch."""
    counts = count_keys(rows, state)
    return KeyGroupResult(state=counts, output=counts)


def count_keys(rows: pd.DataFrame, state: pd.DataFrame) -> pd.DataFrame:
    """The new count of every key in ``rows``, given the current counts in ``state``.

    Written with NumPy on whole columns, as a vectorised operator should be: the pandas
    idiom (``value_counts``, ``set_index``, ``reindex``, ``reset_index``) costs about 2 ms
    per key group of 2,000 keys, this about 0.2 ms.
    """
    keys, seen = np.unique(rows["key"].to_numpy(), return_counts=True)
    counts = seen.astype(np.int64) + held_counts(keys, state, missing=0)
    return pd.DataFrame({"key": keys, "count": counts})


def held_counts(keys: np.ndarray, state: pd.DataFrame | pa.Table, *, missing: int) -> np.ndarray:
    """The count ``state`` holds for each of ``keys`` (distinct); ``missing`` where none."""
    # hash the epoch's few keys and scan the state, not the other way round
    slot = pc.index_in(pa.array(state["key"].to_numpy()), value_set=pa.array(keys))
    at = np.asarray(pc.fill_null(slot, -1).to_numpy(), dtype=np.int64)
    known = np.flatnonzero(at >= 0)
    held = np.full(len(keys), missing, dtype=np.int64)
    held[at[known]] = state["count"].to_numpy()[known]
    return held


@arrow_operator(
    key="key", state_schema="count long", output_schema="key long, count long", name="keyed_count"
)
def keyed_count_arrow(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> KeyGroupResult:
    """:data:`keyed_count` on Arrow tables (:func:`~pyspark_abs.arrow_operator`)."""
    keys, seen = np.unique(rows["key"].to_numpy(), return_counts=True)
    held = held_counts(keys, state, missing=0)
    counts = pa.table({"key": pa.array(keys), "count": pa.array(seen.astype(np.int64) + held)})
    return KeyGroupResult(state=counts, output=counts)


@contextmanager
def session_conf(spark: SparkSession, conf: Mapping[str, str]) -> Iterator[None]:
    """``conf`` set on the session while the block runs (a query started in it keeps it)."""
    before: dict[str, str | None] = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, held in before.items():
            if held is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, held)


def records_counted(rows: pa.Table) -> int:
    """How many records ``(key, count)`` rows count, each row a key's new count: the sum
    over keys of their largest count."""
    grouped = rows.group_by("key").aggregate([("count", "max")])
    return int(pc.sum(grouped["count_max"]).as_py() or 0)


def add_workload_arguments(parser: argparse.ArgumentParser, *, repeats: int = 3) -> None:
    """The options every benchmark takes: workload W's size, repeats and parallelism."""
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--key-groups", type=int, default=256)
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="skip the unmeasured warm-up run of each variant (smoke runs)",
    )
    parser.add_argument("--plot", type=Path, help="where to write the PNG plot")
    parser.add_argument("--workdir", type=Path, help="directory for tables (default: temporary)")


def workload_figures(args: argparse.Namespace) -> dict[str, int]:
    """The options of :func:`add_workload_arguments` a report gives with its figures."""
    return {
        name: getattr(args, name)
        for name in ("records", "keys", "epochs", "repeats", "partitions", "key_groups")
    }


def session(partitions: int, master: str | None = None, jars: str | None = None) -> SparkSession:
    """The benchmark session: the active one if there is one (tests), else a new local[2].

    Args:
        partitions: Shuffle partitions of the checkpoints the benchmark creates.
        master: A Spark master URL instead of ``local[2]``.
        jars: Comma-separated jars for a new session (``spark.jars``).
    """
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        log_config = REPO / "conf" / "log4j2.properties"
        conf = {
            "spark.driver.memory": "4g",
            "spark.driver.extraJavaOptions": f"-Xms4g -Dlog4j2.configurationFile={log_config}",
            "spark.pyspark.python": sys.executable,
        }
        if master is not None:
            conf["spark.master"] = master
        if jars:
            conf["spark.jars"] = jars
        spark = local_session("pyspark-abs-bench", cores=2, conf=conf)
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    return spark


@contextmanager
def workdir(given: Path | None) -> Iterator[Path]:
    """A directory for the benchmark's tables, removed afterwards unless it was given."""
    import shutil

    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    work = Path(tempfile.mkdtemp(prefix="abs-bench-"))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def generate(directory: Path, records: int, keys: int, epochs: int) -> Path:
    """One Parquet file of uniform random keys per epoch; returns ``directory``."""
    rng = np.random.default_rng(1506)
    directory.mkdir(parents=True)
    per_epoch = records // epochs
    for epoch in range(epochs):
        table = pa.table({"key": pa.array(rng.integers(0, keys, per_epoch, dtype=np.int64))})
        pq.write_table(table, directory / f"epoch-{epoch:04d}.parquet")
    return directory


def parquet_source(spark: SparkSession, input_dir: Path) -> DataFrame:
    """Workload W's input as a stream: one file per micro-batch."""
    reader = spark.readStream.schema("key long").option("maxFilesPerTrigger", 1)
    return reader.parquet(str(input_dir))


@dataclass
class PipelineRun:
    """One run of a pipeline: wall time, snapshot root and Spark's per-epoch medians."""

    seconds: float
    root: Path
    spark_ms: dict[str, float]


def run_pipeline(
    spark: SparkSession,
    work: Path,
    name: str,
    source: DataFrame,
    operator: Operator,
    config: AbsConfig,
    outputs: Sequence[str] = (),
) -> PipelineRun:
    """Run a pipeline over everything available in a fresh root under ``work``.

    Each output's sink is a table under the root named after it; without ``outputs`` the
    operator's single output goes to ``counts``.
    """
    root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=work))
    pipeline = Pipeline(
        "bench",
        source,
        operator,
        root=str(root),
        sinks={o: str(root / o) for o in outputs} if outputs else str(root / "counts"),
        config=config,
    )
    started = time.perf_counter()
    query = pipeline.run()
    seconds = time.perf_counter() - started
    return PipelineRun(seconds, root, spark_medians(query.query))


def run_spark_query(frame: DataFrame, out: Path, output_mode: str) -> float:
    """Run Spark's own streaming query over ``frame`` to the end of its input, appending each
    micro-batch to Parquet under ``out``; its wall time."""

    def append(batch: DataFrame, batch_id: int) -> None:
        batch.write.mode("append").parquet(str(out / "rows"))

    started = time.perf_counter()
    query = (
        frame.writeStream.outputMode(output_mode)
        .foreachBatch(append)
        .option("checkpointLocation", str(out / "_checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return time.perf_counter() - started


def spark_medians(query: Any) -> dict[str, float]:
    """Median per-epoch durations Spark reports for micro-batches that read input."""
    progress = [p for p in query.recentProgress if p.numInputRows]
    return {
        phase: round(statistics.median(p.durationMs.get(phase, 0) for p in progress), 1)
        for phase in ("triggerExecution", "addBatch", "walCommit", "commitOffsets")
        if progress
    }


def protocol_medians(root: Path) -> dict[str, float]:
    """Median per-epoch protocol timings from the manifest (ABS runs only)."""
    infos = Snapshots(str(root)).list()[1:] or Snapshots(str(root)).list()
    fields = ("batch_ms", "precommit_ms", "align_ms", "prepare_ms", "commit_ms")
    return {f: round(statistics.median(getattr(i, f) or 0.0 for i in infos), 1) for f in fields}


def largest_state_blob(root: Path, operator: str) -> dict[str, int]:
    """The largest key group's state in the newest snapshot, encoded as Spark keeps it.

    Returns the blob's bytes (LZ4-compressed, as in Spark's state store), its bytes as
    Arrow before compression (what the ``max_key_group_state_bytes`` bound measures) and
    the key group's keys.
    """
    state = Snapshots(str(root)).state_table(operator)
    blob = state.drop_columns([KEY_GROUP, EPOCH])
    codec = BatchCodec(blob.schema, f"state of operator {operator!r}", compress=True)
    groups = state[KEY_GROUP].to_numpy()
    largest = {"bytes": 0, "arrow_bytes": 0, "keys": 0}
    for group in np.unique(groups):
        rows = blob.filter(pc.equal(state[KEY_GROUP], pa.scalar(group, pa.int32())))
        message = codec.message(rows.combine_chunks())
        if message.size > largest["arrow_bytes"]:
            size = len(codec.frame(message))
            largest = {"bytes": size, "arrow_bytes": message.size, "keys": rows.num_rows}
    return largest


def interleave(
    variants: Sequence[str],
    repeats: int,
    run: Callable[[str], float],
    *,
    warm_up: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, list[float]]:
    """Run every variant ``repeats`` times, rotating the order each round; seconds per variant.

    ``run`` runs one variant and returns its wall time. With ``warm_up``, each variant first
    runs once unmeasured.
    """
    if warm_up:
        for variant in variants:
            log(f"warm-up  {variant:<22} {run(variant):7.1f} s")
    seconds: dict[str, list[float]] = {v: [] for v in variants}
    order = list(variants)
    for repeat in range(repeats):
        shift = repeat % len(order)
        for variant in order[shift:] + order[:shift]:
            elapsed = run(variant)
            seconds[variant].append(elapsed)
            log(f"repeat {repeat + 1} {variant:<22} {elapsed:7.1f} s")
    return seconds


def median(values: Sequence[float]) -> float:
    """The median of some run times."""
    return statistics.median(values)


def print_rates(
    records: int,
    seconds: Mapping[str, Sequence[float]],
    reference: str,
    costs: Mapping[str, RunCosts] | None = None,
    repeats: int = 0,
) -> None:
    """A table: median seconds, records/s and throughput relative to ``reference``.

    With ``costs``, also the median CPU seconds of the last ``repeats`` runs.
    """
    base = records / median(seconds[reference])
    cpu = f" {'median CPU s':>13}" if costs else ""
    print(f"\n{'variant':<24} {'median s':>9} {'records/s':>11} {'vs ' + reference:>14}{cpu}")
    for variant, values in seconds.items():
        rate = records / median(values)
        row = f"{variant:<24} {median(values):>9.2f} {rate:>11,.0f} {rate / base:>14.3f}"
        if costs:
            row += f" {median(costs[variant].measured_cpu(repeats)):>13.1f}"
        print(row)


def cost_figures(costs: Mapping[str, RunCosts], repeats: int) -> dict[str, Any]:
    """The JSON figures of the variants' costs: memory peaks and CPU seconds per run."""
    return {
        "memory_peaks": {v: c.memory() for v, c in costs.items()},
        "cpu_seconds": {v: c.measured_cpu(repeats) for v, c in costs.items()},
        "cpu_median_s": {v: round(median(c.measured_cpu(repeats)), 2) for v, c in costs.items()},
        "cpu_median_s_by_process": {
            v: c.measured_cpu_by_process(repeats) for v, c in costs.items()
        },
    }


def emit(figures: Mapping[str, Any]) -> None:
    """Print the benchmark's final JSON line."""
    print(json.dumps(figures), flush=True)


def plot(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    spreads: Mapping[str, Sequence[tuple[float, float]]] | None = None,
    xticks: Sequence[float] | None = None,
) -> Path:
    """Write a line plot (one line per series of (x, y) points) as a PNG.

    ``spreads`` gives, for a series, the (low, high) range at each of its points (say, the
    fastest and slowest run), drawn as a band around the line.
    """

    figure, axes = _axes()
    for label, points in series.items():
        xs, ys = zip(*points, strict=True) if points else ((), ())
        line = axes.plot(xs, ys, marker="o", label=label)[0]
        band = (spreads or {}).get(label)
        if band:
            lows, highs = zip(*band, strict=True)
            axes.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.15)
    axes.axhline(0, color="grey", linewidth=0.8)
    axes.set_title(title)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if xticks is not None:
        axes.set_xticks(list(xticks))
    axes.grid(alpha=0.3)
    axes.legend()
    return _save(figure, path)


def bar_plot(
    path: Path,
    title: str,
    ylabel: str,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float]],
) -> Path:
    """Write grouped bars (one bar per series in each group) as a PNG."""
    figure, axes = _axes()
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        axes.bar([g + i * width for g in range(len(groups))], list(values), width, label=label)
    axes.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))])
    axes.set_xticklabels(list(groups))
    axes.set_title(title)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3, axis="y")
    axes.legend()
    return _save(figure, path)


def _axes() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt.subplots(figsize=(7, 4.5))


def _save(figure: Any, path: Path) -> Path:
    from matplotlib import pyplot as plt

    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def measured(
    spark: SparkSession,
    costs: dict[str, RunCosts],
    run: Callable[[str], float],
    extra_roots: Sequence[int] = (),
) -> Callable[[str], float]:
    """``run`` with the memory and CPU time of each run sampled into ``costs[variant]``."""

    def wrapped(variant: str) -> float:
        with CostSampler([jvm_pid(spark), *extra_roots]) as sampler:
            seconds = run(variant)
        costs.setdefault(variant, RunCosts()).merge(sampler.costs)
        return seconds

    return wrapped


def jvm_pid(spark: SparkSession) -> int:
    """The process id of the session's driver JVM."""
    return int(spark.sparkContext._jvm.ProcessHandle.current().pid())  # type: ignore[union-attr]
