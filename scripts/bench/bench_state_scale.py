"""Cost of a steady epoch as the state grows: pyspark-abs against Spark's own state stores.

A keyed count (``_bench.keyed_count``; Spark's ``groupBy("key").count()`` for the built-in
stores) over N existing keys: one load epoch writes every key once, then each steady epoch
reads ``--records`` records (default 200,000) over uniform random keys in [0, N). One
streaming query per variant and N reads one Parquet file per micro-batch; the script drops
the files in one at a time and waits for each epoch to finish (``processAllAvailable``,
and for pyspark-abs the background commit), so each steady epoch is measured alone:

* wall time and CPU time (user + system of the driver, its JVM and every Python worker);
* bytes the epoch added to Spark's checkpoint directory and to the Delta tables of the
  snapshot root (state table and manifest; the sink is left out, as the built-in variants'
  Parquet output is): the sizes of files created or grown during the epoch;
* peak resident memory per process kind over the whole run (load included).

Variants: ``abs_async`` (snapshots every epoch, asynchronous commit), ``abs_whole`` (the
same, its live-state files written whole at every change: ``local_state_change_share=0``),
``abs_off``
(``snapshots=False``), ``builtin_rocksdb`` (RocksDB state store with changelog
checkpointing), ``builtin_default`` (Spark's default HDFS-backed store). Variants are
interleaved (the order rotates each repeat) and the figures are medians (times) and means
(bytes) over the steady epochs of every repeat. The last line printed is one JSON object;
``results`` maps variant to N (a string) to ``{"epoch_s", "cpu_s", "checkpoint_bytes",
"delta_bytes", "local_bytes"}`` (``local_bytes``: live-state files pyspark-abs wrote to
the local disk, not durable). A run that fails (Spark's default store runs out of a 4 GB
heap at 32M keys) is left out of ``results`` and its error is in ``failed``; the JVM may not
survive it, so the variants run after it at that N fail too.

    python scripts/bench/bench_state_scale.py [--keys 500000,2000000,8000000,32000000]
        [--records 200000] [--steady-epochs 3] [--repeats 1] [--plot PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import _bench
import _costs
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pyspark_abs import AbsConfig, Pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_bench.pickle_by_value(__name__)

DEFAULT_KEYS = (500_000, 2_000_000, 8_000_000, 32_000_000)
ABS: dict[str, dict[str, Any]] = {
    "abs_async": {"commit_mode": "async"},
    "abs_whole": {"commit_mode": "async", "local_state_change_share": 0.0},
    "abs_off": {"snapshots": False},
}
BUILTIN: dict[str, dict[str, str]] = {
    "builtin_rocksdb": _bench.ROCKSDB,
    "builtin_default": {},
}
VARIANTS = [*ABS, *BUILTIN]
FIGURES = ("epoch_s", "cpu_s", "checkpoint_bytes", "delta_bytes", "local_bytes")


@dataclass(frozen=True)
class Epoch:
    """What one steady epoch cost."""

    epoch_s: float
    cpu_s: float
    checkpoint_bytes: int
    delta_bytes: int
    local_bytes: int


def generate(directory: Path, keys: int, records: int, epochs: int) -> list[Path]:
    """The load file (every key once, shuffled), then one file per steady epoch."""
    rng = np.random.default_rng(2020)
    directory.mkdir(parents=True)
    files = [directory / "load.parquet"]
    pq.write_table(pa.table({"key": pa.array(rng.permutation(keys).astype(np.int64))}), files[0])
    for epoch in range(epochs):
        path = directory / f"steady-{epoch:03d}.parquet"
        pq.write_table(pa.table({"key": pa.array(rng.integers(0, keys, records))}), path)
        files.append(path)
    return files


def file_sizes(directory: Path) -> dict[str, int]:
    """Size of every file under ``directory`` (nothing if it does not exist)."""
    sizes = {}
    for parent, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(parent, name)
            try:
                sizes[path] = os.path.getsize(path)
            except OSError:
                continue  # removed by Spark's maintenance meanwhile
    return sizes


def added_bytes(before: dict[str, int], after: dict[str, int]) -> int:
    """Bytes of the files created or grown between two listings."""
    return sum(size for path, size in after.items() if before.get(path, -1) < size)


@dataclass
class Layout:
    """Where one run keeps its files."""

    checkpoint: Path
    delta: Path | None
    sink: Path
    local: Path | None = None


@contextmanager
def builtin_query(
    spark: SparkSession, variant: str, source: DataFrame, run_dir: Path
) -> Iterator[tuple[Callable[[], None], Layout]]:
    """A built-in store's keyed count, appending each epoch's counts to Parquet."""
    layout = Layout(run_dir / "_checkpoint", None, run_dir / "counts")

    def append(batch: DataFrame, batch_id: int) -> None:
        batch.write.mode("append").parquet(str(layout.sink))

    conf = BUILTIN[variant]
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        query = (
            source.groupBy("key")
            .count()
            .writeStream.outputMode("update")
            .foreachBatch(append)
            .option("checkpointLocation", str(layout.checkpoint))
            .start()
        )
    finally:
        for key in conf:
            spark.conf.unset(key)
    try:
        yield query.processAllAvailable, layout
    finally:
        query.stop()


@contextmanager
def abs_query(
    spark: SparkSession, variant: str, source: DataFrame, run_dir: Path, key_groups: int
) -> Iterator[tuple[Callable[[], None], Layout]]:
    """The pyspark-abs keyed count; an epoch is done once it is committed."""
    root = run_dir / "root"
    layout = Layout(root / "_checkpoint", root, run_dir / "counts", run_dir / "local")
    config = AbsConfig(key_groups=key_groups, local_state_dir=str(layout.local), **ABS[variant])
    pipeline = Pipeline(
        "scale", source, _bench.keyed_count, root=str(root), sinks=str(layout.sink), config=config
    )
    query = pipeline.start()

    def finish_epoch() -> None:
        query.process_all_available()
        query.drain()

    try:
        yield finish_epoch, layout
    finally:
        query.stop()


def run_variant(
    spark: SparkSession,
    work: Path,
    variant: str,
    files: Sequence[Path],
    key_groups: int,
    costs: dict[str, _costs.RunCosts],
) -> tuple[float, list[Epoch]]:
    """Load the keys, then run and measure each steady epoch; return load seconds, epochs."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{variant}-", dir=work))
    landing = run_dir / "input"
    landing.mkdir()
    source = spark.readStream.schema("key long").option("maxFilesPerTrigger", 1)
    frame = source.parquet(str(landing))
    jvm = _bench.jvm_pid(spark)
    epochs = []
    query = (
        builtin_query(spark, variant, frame, run_dir)
        if variant in BUILTIN
        else abs_query(spark, variant, frame, run_dir, key_groups)
    )
    with _costs.CostSampler([jvm]) as sampler, query as (finish_epoch, layout):
        started = time.perf_counter()
        shutil.copy(files[0], landing / files[0].name)
        finish_epoch()
        load_s = time.perf_counter() - started
        for path in files[1:]:
            checkpoint = file_sizes(layout.checkpoint)
            delta = _delta_sizes(layout)
            local = file_sizes(layout.local) if layout.local else {}
            cpu = _costs.cpu_seconds([jvm])
            started = time.perf_counter()
            shutil.copy(path, landing / path.name)
            finish_epoch()
            epochs.append(
                Epoch(
                    epoch_s=time.perf_counter() - started,
                    cpu_s=_costs.cpu_seconds([jvm]) - cpu,
                    checkpoint_bytes=added_bytes(checkpoint, file_sizes(layout.checkpoint)),
                    delta_bytes=added_bytes(delta, _delta_sizes(layout)),
                    local_bytes=added_bytes(local, file_sizes(layout.local)) if layout.local else 0,
                )
            )
    costs.setdefault(variant, _costs.RunCosts()).merge(sampler.costs)
    shutil.rmtree(run_dir, ignore_errors=True)
    return load_s, epochs


def _delta_sizes(layout: Layout) -> dict[str, int]:
    """Sizes of the snapshot root's files outside its Spark checkpoint."""
    if layout.delta is None:
        return {}
    inside = str(layout.checkpoint)
    return {p: s for p, s in file_sizes(layout.delta).items() if not p.startswith(inside)}


def steady_figures(epochs: Sequence[Epoch]) -> dict[str, float]:
    """Each figure over steady epochs: times as medians, bytes as means.

    Bytes are averaged: live-state files are rewritten whole only every few dozen epochs,
    and a median would leave those epochs out.
    """
    figures: dict[str, float] = {}
    for name in FIGURES:
        values = [getattr(e, name) for e in epochs]
        if name.endswith("_s"):
            figures[name] = round(statistics.median(values), 3)
        else:
            figures[name] = int(statistics.mean(values))
    return figures


def parse_keys(text: str) -> list[int]:
    """``500000,2000000`` (or with M/k suffixes: ``0.5M,2M``) as key counts."""
    counts = []
    for part in text.split(","):
        part = part.strip().lower()
        scale = 1_000_000 if part.endswith("m") else 1_000 if part.endswith("k") else 1
        number = float(part.rstrip("mk"))
        if number <= 0:
            raise argparse.ArgumentTypeError(f"key counts must be positive, got {part!r}")
        counts.append(int(number * scale))
    return counts


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every variant at every N, print a table and a JSON line; return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", type=parse_keys, default=list(DEFAULT_KEYS))
    parser.add_argument("--records", type=int, default=200_000, help="records per steady epoch")
    parser.add_argument("--steady-epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--key-groups", type=int, default=256)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--plot", type=Path, help="PNG of epoch time; bytes go beside it")
    parser.add_argument("--workdir", type=Path, help="directory for tables (default: temporary)")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; choose from {VARIANTS}")
    spark = _bench.session(args.partitions)
    results: dict[str, dict[str, dict[str, float]]] = {v: {} for v in variants}
    loads: dict[str, dict[str, float]] = {v: {} for v in variants}
    memory: dict[str, dict[str, dict[str, float]]] = {v: {} for v in variants}
    failed: dict[str, dict[str, str]] = {v: {} for v in variants}
    with _bench.workdir(args.workdir) as work:
        for keys in args.keys:
            files = generate(work / f"input-{keys}", keys, args.records, args.steady_epochs)
            steady: dict[str, list[Epoch]] = {v: [] for v in variants}
            costs: dict[str, _costs.RunCosts] = {}
            for repeat in range(args.repeats):
                shift = repeat % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    try:
                        load_s, epochs = run_variant(
                            spark, work, variant, files, args.key_groups, costs
                        )
                    except Exception as err:  # e.g. Spark's JVM ran out of heap
                        failed[variant][str(keys)] = f"{type(err).__name__}: {err}"[:300]
                        print(f"N={keys:>11,} {variant:<16} failed: {err}"[:300], flush=True)
                        continue
                    steady[variant] += epochs
                    loads[variant][str(keys)] = round(load_s, 2)
                    print(
                        f"N={keys:>11,} {variant:<16} load {load_s:7.1f} s, steady epochs "
                        + ", ".join(f"{e.epoch_s:.2f} s" for e in epochs),
                        flush=True,
                    )
            for variant in variants:
                if steady[variant]:
                    results[variant][str(keys)] = steady_figures(steady[variant])
                if variant in costs:
                    memory[variant][str(keys)] = costs[variant].memory()
            shutil.rmtree(work / f"input-{keys}", ignore_errors=True)
    print_table(results, args.keys)
    figures = {
        "records_per_epoch": args.records,
        "steady_epochs": args.steady_epochs,
        "repeats": args.repeats,
        "partitions": args.partitions,
        "key_groups": args.key_groups,
        "load_s": loads,
        "memory_peaks": memory,
        "results": results,
        "failed": {v: f for v, f in failed.items() if f},
    }
    if args.plot is not None:
        plot(args.plot, results)
    _bench.emit(figures)
    return figures


def print_table(results: dict[str, dict[str, dict[str, float]]], keys: Sequence[int]) -> None:
    """One row per variant and N: the steady epochs' figures (see :func:`steady_figures`)."""
    header = ("variant", "N keys", "epoch s", "CPU s", "ckpt MB", "Delta MB", "local MB")
    print("\n{:<16} {:>11} {:>8} {:>7} {:>8} {:>9} {:>9}".format(*header))
    for variant, by_keys in results.items():
        for n in keys:
            if str(n) not in by_keys:
                print(f"{variant:<16} {n:>11,}   failed (see above)")
                continue
            r = by_keys[str(n)]
            print(
                f"{variant:<16} {n:>11,} {r['epoch_s']:>8.2f} {r['cpu_s']:>7.2f} "
                f"{r['checkpoint_bytes'] / 1e6:>8.2f} {r['delta_bytes'] / 1e6:>9.2f} "
                f"{r['local_bytes'] / 1e6:>9.2f}"
            )


def plot(path: Path, results: dict[str, dict[str, dict[str, float]]]) -> None:
    """Epoch time against N at ``path``, and bytes per epoch beside it (``*_bytes.png``)."""

    def series(value: Callable[[dict[str, float]], float]) -> dict[str, list[tuple[float, float]]]:
        return {
            v: [(int(n) / 1e6, value(r)) for n, r in sorted(by.items(), key=lambda i: int(i[0]))]
            for v, by in results.items()
        }

    _bench.plot(
        path, "Steady epoch time", "million keys", "seconds", series(lambda r: r["epoch_s"])
    )
    _bench.plot(
        path.with_name(f"{path.stem}_bytes{path.suffix}"),
        "Bytes written per steady epoch (checkpoint + Delta)",
        "million keys",
        "MB",
        series(lambda r: (r["checkpoint_bytes"] + r["delta_bytes"]) / 1e6),
    )


if __name__ == "__main__":
    main()
