"""Probe for the state-scale design: a keyed count on Spark's per-key MapState.

One option for making an epoch's state cost proportional to its change is to keep each key's
state in Spark's state store as its own entry: ``transformWithStateInPandas`` grouped by key
group, with a ``MapState`` from key to count (RocksDB with changelog checkpointing, which the
API requires). This script measures that option on the state-scale workload: one load epoch
writes N keys, then each steady epoch reads ``--records`` records over uniform keys. It
prints the seconds and the checkpoint bytes per epoch; compare them with
``bench_state_scale.py``. The last line is
one JSON object.

    python scripts/bench/probe_map_state.py [--keys 500000] [--records 200000] [--epochs 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import _bench
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from bench_state_scale import added_bytes, file_sizes
from pyspark.sql import functions as F
from pyspark.sql.streaming.stateful_processor import (
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

_bench.pickle_by_value(__name__)


class MapStateCount(StatefulProcessor):
    """Count records per key, one MapState entry per key, read and written key by key."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.counts = handle.getMapState("counts", "key long", "count long")

    def handleInputRows(
        self, key: Any, rows: Iterator[Any], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        frame = pd.concat(list(rows))  # pandas frames: transformWithStateInPandas
        keys, seen = np.unique(frame["key"].to_numpy(), return_counts=True)
        counts = []
        for k, n in zip(keys.tolist(), seen.tolist(), strict=True):
            old = self.counts.getValue((k,))
            count = (old[0] if old else 0) + n
            self.counts.updateValue((k,), (count,))
            counts.append(count)
        yield pd.DataFrame({"key": keys, "count": counts})

    def close(self) -> None:
        return None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the probe; print the seconds per epoch and a JSON line; return the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--keys", type=int, default=500_000)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--key-groups", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args(argv)
    spark = _bench.session(args.partitions)
    work = Path(tempfile.mkdtemp(prefix="abs-probe-"))
    landing = work / "input"
    landing.mkdir()
    rng = np.random.default_rng(2020)
    source = spark.readStream.schema("key long").option("maxFilesPerTrigger", 1)
    grouped = source.parquet(str(landing)).withColumn(
        "key_group", F.pmod(F.xxhash64("key"), F.lit(args.key_groups))
    )
    counts = grouped.groupBy("key_group").transformWithStateInPandas(
        MapStateCount(), "key long, count long", "Update", "None"
    )
    with _bench.session_conf(spark, _bench.ROCKSDB):
        query = (
            counts.writeStream.outputMode("update")
            .format("noop")
            .option("checkpointLocation", str(work / "_checkpoint"))
            .start()
        )

    written: list[int] = []

    def epoch(number: int, keys: np.ndarray[Any, Any]) -> float:
        pq.write_table(pa.table({"key": pa.array(keys)}), landing / f"{number:04d}.parquet")
        before = file_sizes(work / "_checkpoint")
        started = time.perf_counter()
        query.processAllAvailable()
        seconds = time.perf_counter() - started
        written.append(added_bytes(before, file_sizes(work / "_checkpoint")))
        return seconds

    try:
        load_s = epoch(0, rng.permutation(args.keys).astype(np.int64))
        steady = [
            epoch(n, rng.integers(0, args.keys, args.records)) for n in range(1, args.epochs + 1)
        ]
    finally:
        query.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"load of {args.keys:,} keys: {load_s:.2f} s")
    print("steady epochs: " + ", ".join(f"{s:.2f} s" for s in steady))
    print("checkpoint bytes: " + ", ".join(f"{b / 1e6:.2f} MB" for b in written[1:]))
    figures = {
        "keys": args.keys,
        "records": args.records,
        "load_s": round(load_s, 2),
        "steady_s": [round(s, 2) for s in steady],
        "epoch_s": round(statistics.median(steady), 2),
        "checkpoint_bytes": int(statistics.median(written[1:])),
    }
    _bench.emit(figures)
    return figures


if __name__ == "__main__":
    main()
