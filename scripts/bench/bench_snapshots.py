"""Benchmark of savepoint operations: compaction, rollback, restore with rescale, vacuum.

A keyed count over a Delta table source (one append per epoch) builds a snapshot root; the
script then times each maintenance and restore operation on it and reports state-table size
before and after compaction. The last line of output is one JSON object with every figure.

    python scripts/bench/bench_snapshots.py [--records 1000000] [--keys 200000] [--epochs 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _bench
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from pyspark_abs import (
    AbsConfig,
    DeltaSource,
    Pipeline,
    Snapshots,
    local_session,
    restore,
    rollback,
)
from pyspark_abs.upkeep.compaction import compact
from pyspark_abs.upkeep.retention import vacuum
from pyspark_abs.upkeep.validation import validate


def table_size(uri: str) -> dict[str, int]:
    """Files, rows and bytes of a Delta table's latest version."""
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    return {
        "files": actions.num_rows,
        "rows": int(pc.sum(actions["num_records"]).as_py() or 0),
        "bytes": int(pc.sum(actions["size_bytes"]).as_py() or 0),
    }


def timed(what: str, figures: dict[str, Any], action: Any) -> Any:
    started = time.perf_counter()
    result = action()
    figures[f"{what}_s"] = round(time.perf_counter() - started, 3)
    print(f"{what}: {figures[f'{what}_s']:.2f} s", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workdir", help="directory for tables (default: a temporary one)")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-snapshots-"))
    log_config = Path(__file__).parents[2] / "conf" / "log4j2.properties"
    spark = local_session(
        "bench-snapshots",
        cores=2,
        shuffle_partitions=4,
        conf={
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log_config}",
            "spark.driver.memory": "4g",
        },
    )
    rng = np.random.default_rng(7)
    source = str(work / "source")
    per_epoch = args.records // args.epochs
    for _ in range(args.epochs):
        keys = rng.integers(0, args.keys, per_epoch, dtype=np.int64)
        write_deltalake(source, pa.table({"key": keys}), mode="append")

    def pipeline(root: Path, key_groups: int = 256) -> Pipeline:
        return Pipeline(
            "bench",
            DeltaSource(source, max_files_per_trigger=1),
            _bench.keyed_count,
            root=str(root),
            sinks={"output": str(root / "sink")},
            config=AbsConfig(key_groups=key_groups, compaction_ratio=0),
        )

    figures: dict[str, Any] = {
        "records": args.records,
        "keys": args.keys,
        "epochs": args.epochs,
    }
    root = work / "root"
    timed("run", figures, lambda: pipeline(root).run())
    state_uri = str(root / "state" / "keyed_count")
    figures["state_before_compaction"] = table_size(state_uri)
    figures["live_keys"] = Snapshots(str(root)).latest().state_keys  # type: ignore[union-attr]
    timed("compact", figures, lambda: compact(str(root)))
    figures["state_after_compaction"] = table_size(state_uri)
    middle = args.epochs // 2 - 1
    timed("rollback", figures, lambda: rollback(str(root), middle))
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    timed("reprocess_after_rollback", figures, lambda: pipeline(root).run())
    copy = work / "copy"
    timed("restore_into_new_root", figures, lambda: restore(str(root), middle, str(copy)))
    timed("run_restored_with_rescale", figures, lambda: pipeline(copy, key_groups=64).run())
    original = Snapshots(str(root), spark).state("keyed_count")
    rescaled = Snapshots(str(copy), spark).state("keyed_count")
    figures["restored_state_equal"] = original.exceptAll(rescaled).isEmpty() and (
        rescaled.exceptAll(original).isEmpty()
    )
    problems = timed("validate", figures, lambda: validate(str(root)))
    figures["validate_problems"] = len(problems)
    report = timed("vacuum", figures, lambda: vacuum(str(root), keep_last=2, min_age_seconds=0))
    figures["vacuum_deleted_files"] = sum(len(v) for v in report.deleted.values())
    spark.stop()
    print(json.dumps(figures))
    return 0 if figures["restored_state_equal"] and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
