"""The word count's whole lifecycle on an S3 API, run as its own program.

``python -m tests.integration.s3_run BUCKET OUT`` keeps everything under ``BUCKET`` (an
``s3://`` URI): the landing directory, the snapshot root, its sinks, Spark's checkpoint, and
a restored copy. It lands one file per run and crashes after PREPARED of epoch 1, restarts,
names epoch 1 ``two``, compacts, rolls back to ``two``, runs on empty local disks (as a new
cluster would), restores ``two`` into another root that runs at other partition and
key-group counts, then vacuums and validates both roots.
It writes the final state and sink of each root as Parquet under the local directory ``OUT``
and prints one JSON line. Its own program, because Spark's S3 settings (``--jars`` and
``--conf`` in ``PYSPARK_SUBMIT_ARGS``) and the credentials its Python workers inherit must be
in place before Spark starts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark_abs import (
    Snapshots,
    compact,
    restore,
    rollback,
    tag,
    vacuum,
    validate,
)
from pyspark_abs.session import local_session
from tests.support.s3 import crashed_after_prepared, land, pipeline


def main(bucket: str, out: str) -> None:
    spark = local_session("s3 lifecycle", shuffle_partitions=2)
    root, copy = f"{bucket}/root", f"{bucket}/copy"
    crashed_after_prepared(bucket, root)
    recovered = pipeline(bucket, root).run().recovered_epochs
    tag(root, 1, "two")
    land(bucket, 2)
    pipeline(bucket, root).run()
    compacted = [(c.table, c.as_of_epoch) for c in compact(root) if c.version is not None]
    rollback(root, "two")
    # as on a new cluster: empty local disks, the live state rebuilt from the tables on S3
    new_cluster = Path(out) / "new_cluster_live_state"
    pipeline(bucket, root, local_state_dir=str(new_cluster)).run()
    rebuilt = sum(1 for p in new_cluster.rglob("*") if p.is_file())
    land(bucket, 3)
    pipeline(bucket, root).run()

    restore(root, "two", copy)
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    pipeline(bucket, copy, key_groups=5).run()
    vacuumed = vacuum(root, keep_last=1, min_age_seconds=0)
    problems = [str(p) for r in (root, copy) for p in validate(r)]
    for name, base in (("root", root), ("copy", copy)):
        snapshots = Snapshots(base, spark)
        snapshots.state("word_count").write.parquet(f"{out}/{name}_state")
        snapshots.sink("output").write.parquet(f"{out}/{name}_sink")
    report = {
        "recovered": recovered,
        "compacted": compacted,
        "expired": vacuumed.expired,
        "deleted": sum(len(files) for files in vacuumed.deleted.values()),
        "newest": Snapshots(root).list()[-1].epoch,
        "rebuilt_files": rebuilt,
    }
    print(json.dumps({**report, "problems": problems}))


if __name__ == "__main__":
    main(*sys.argv[1:])
