"""Recovery on a new cluster: from ``start()`` to the first committed epoch after a restart.

A keyed count over N keys (``_bench.keyed_count``; Spark's ``groupBy("key").count()`` for
RocksDB): a load epoch writes every key once, the run stops, one steady file of
``--records`` records lands, and the query restarts in a new process. Measured, from the
restart's ``run()`` call (the new process's session already up) to its return with the
steady epoch committed:

* ``abs_warm``: pyspark-abs restarted on the same local live-state files;
* ``abs_new_cluster``: pyspark-abs restarted with an empty local-state directory, as on a new
  cluster: the live state is rebuilt from the snapshot's state table;
* ``abs_restore``: ``restore`` of the load epoch into a new root (timed too), then a run on it
  with an empty local-state directory;
* ``rocksdb``: Spark's RocksDB state store (changelog checkpointing) restarted from its
  checkpoint.

Each restart runs in a child process of its own: the RocksDB restart and the restore (of the
load epoch) read the first steady file, then the warm restart reads it too, and the new
cluster's restart, with the local-state directory removed, reads a second one. Targets:
``abs_new_cluster`` at most ``rocksdb`` at every N, and at most 2x ``abs_warm`` at the
largest N. The last line printed is one JSON object.

    python scripts/bench/bench_recovery.py [--keys 2000000,8000000,32000000] [--records 200000]
        [--key-groups 256] [--partitions 4]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _bench
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

VARIANTS = ["abs_warm", "abs_new_cluster", "abs_restore", "rocksdb"]


# ---------------------------------------------------------------------------------------
# Children: one Spark session each, one action, one JSON line.


def child(order: dict[str, Any]) -> dict[str, Any]:
    spark = _bench.session(order["partitions"])
    started = time.perf_counter()
    if order["action"] == "build":
        run_abs(spark, order)
        run_rocksdb(spark, order)
    elif order["action"] == "restart_rocksdb":
        run_rocksdb(spark, order)
    else:
        run_abs(spark, order)
    return {"seconds": time.perf_counter() - started}


def run_rocksdb(spark: Any, order: dict[str, Any]) -> None:
    run_dir = Path(order["rocksdb"])

    def append(batch: Any, batch_id: int) -> None:
        batch.write.mode("append").parquet(str(run_dir / "counts"))

    for key, value in _bench.ROCKSDB.items():
        spark.conf.set(key, value)
    (
        spark.readStream.schema("key long")
        .parquet(order["landing"])
        .groupBy("key")
        .count()
        .writeStream.outputMode("update")
        .foreachBatch(append)
        .option("checkpointLocation", str(run_dir / "_checkpoint"))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )


def run_abs(spark: Any, order: dict[str, Any]) -> None:
    from pyspark_abs import AbsConfig, Pipeline, SparkFileSource, restore

    root = order["dir"] + "/root"
    config = AbsConfig(key_groups=order["key_groups"], local_state_dir=order["local"])
    if order["action"] == "restore":
        restore(order["source_root"], order["epoch"], root)
    pipeline = Pipeline(
        "recovery",
        SparkFileSource(order["landing"], "parquet", schema="key long"),
        _bench.keyed_count,
        root=root,
        sinks=order["dir"] + "/counts",
        config=config,
    )
    pipeline.run()


def spawn(order: dict[str, Any]) -> float:
    """Run one action in a child process; its seconds (session start excluded)."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(order)],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"{order['action']} failed:\n{done.stderr[-4000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


# ---------------------------------------------------------------------------------------
# The parent: build, copy, restart.


def measure(work: Path, keys: int, args: argparse.Namespace) -> dict[str, float]:
    """Build a root and a RocksDB checkpoint of ``keys`` keys, then restart each way."""
    landing = work / f"landing-{keys}"
    landing.mkdir(parents=True)
    rng = np.random.default_rng(keys)
    landed: list[np.ndarray[Any, Any]] = []

    def land(column: np.ndarray[Any, Any]) -> None:
        landed.append(column.astype(np.int64))
        name = f"{len(landed) - 1}.parquet"
        pq.write_table(pa.table({"key": pa.array(landed[-1])}), landing / name)

    common = {"partitions": args.partitions, "key_groups": args.key_groups, "landing": str(landing)}
    built, restored = work / f"abs-{keys}", work / f"restored-{keys}"
    abs_order = {**common, "dir": str(built), "local": str(built / "local")}
    rocksdb_order = {**common, "rocksdb": str(work / f"rocksdb-{keys}")}
    land(rng.permutation(keys))
    spawn({**abs_order, **rocksdb_order, "action": "build"})
    seconds: dict[str, float] = {}

    def timed(variant: str, order: dict[str, Any]) -> None:
        seconds[variant] = round(spawn(order), 2)
        print(f"{keys:>12,} keys  {variant:<16} {seconds[variant]:7.2f} s", flush=True)

    land(rng.integers(0, keys, args.records))
    timed("rocksdb", {**rocksdb_order, "action": "restart_rocksdb"})
    restore_order = {"source_root": str(built / "root"), "epoch": 0}
    restore_order |= {"dir": str(restored), "local": str(restored / "local")}
    timed("abs_restore", {**common, **restore_order, "action": "restore"})
    timed("abs_warm", {**abs_order, "action": "restart"})
    check("rocksdb", _rocksdb_counts(rocksdb_order["rocksdb"]), landed)
    check("abs_restore", _delta_counts(restored / "counts"), landed)
    land(rng.integers(0, keys, args.records))
    shutil.rmtree(built / "local")
    timed("abs_new_cluster", {**abs_order, "action": "restart"})
    check("abs_new_cluster", _delta_counts(built / "counts"), landed)
    for path in (built, Path(rocksdb_order["rocksdb"]), restored, landing):
        shutil.rmtree(path, ignore_errors=True)
    return seconds


def check(variant: str, emitted: pa.Table, landed: Sequence[np.ndarray[Any, Any]]) -> None:
    """Check that the restart kept the whole state, against counts made here with NumPy.

    Every key of the last landed file must have, as its newest emitted count, its number
    of records in all the landed files.
    """
    newest = emitted.group_by("key").aggregate([("count", "max")])
    got = dict(zip(newest["key"].to_pylist(), newest["count_max"].to_pylist(), strict=True))
    expected = np.bincount(np.concatenate(landed))
    wrong = [
        (key, got.get(key), int(expected[key]))
        for key in np.unique(landed[-1]).tolist()
        if got.get(key) != expected[key]
    ]
    if wrong:
        raise SystemExit(
            f"{variant}: {len(wrong)} keys of the last file have wrong counts after the "
            f"restart, e.g. (key, emitted, expected) {wrong[:5]}"
        )


def _delta_counts(table: Path) -> pa.Table:
    from deltalake import DeltaTable

    return DeltaTable(str(table)).to_pyarrow_table(columns=["key", "count"])


def _rocksdb_counts(run_dir: str) -> pa.Table:
    return pq.read_table(Path(run_dir) / "counts", columns=["key", "count"])


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Measure every variant at every N; print a table and a JSON line; return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", default="2000000,8000000,32000000")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--key-groups", type=int, default=256)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = child(json.loads(args.child))
        print(json.dumps(result), flush=True)
        return result
    sizes = [int(k) for k in args.keys.split(",")]
    with _bench.workdir(args.workdir) as work:
        results = {str(n): measure(work, n, args) for n in sizes}
    largest = results[str(sizes[-1])]
    targets = {
        "new_cluster_at_most_rocksdb": all(
            r["abs_new_cluster"] <= r["rocksdb"] for r in results.values()
        ),
        "new_cluster_at_most_2x_warm_at_largest": largest["abs_new_cluster"]
        <= 2 * largest["abs_warm"],
    }
    print(f"\n{'keys':>12} " + " ".join(f"{v:>16}" for v in VARIANTS))
    for n, r in results.items():
        print(f"{int(n):>12,} " + " ".join(f"{r[v]:>16.2f}" for v in VARIANTS))
    for name, met in targets.items():
        print(f"{name}: {'meets' if met else 'MISSES'}")
    figures = {
        "keys": sizes,
        "records": args.records,
        "key_groups": args.key_groups,
        "partitions": args.partitions,
        "seconds": results,
        "targets_met": targets,
    }
    _bench.emit(figures)
    return figures


if __name__ == "__main__":
    main()
