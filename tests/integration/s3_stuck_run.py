"""A decided epoch on an S3 API whose sink file is deleted, replaced by a rollback; run as its
own program (see tests/integration/s3_run.py for why).

``python -m tests.integration.s3_stuck_run BUCKET`` runs the word count over the bucket's
landing directory, one file per run: epoch 1 fails after PREPARED, and one of the files it
wrote to the sink is deleted from the bucket, as a lifecycle rule would. It records what the
next start and validate say, rolls back to epoch 0, runs the remaining files, and prints one
JSON line with what it saw and the final state and sink rows.
"""

from __future__ import annotations

import json
import sys

import pyarrow.fs as pafs

from pyspark_abs import Snapshots, rollback, validate
from pyspark_abs.errors import UncommittableEpochError
from pyspark_abs.session import local_session
from pyspark_abs.storage.store import DeltaStore
from tests.support.inputs import EPOCHS
from tests.support.s3 import crashed_after_prepared, land, pipeline


def main(bucket: str) -> None:
    local_session("s3 stuck epoch", shuffle_partitions=2)
    root = f"{bucket}/root"
    sink = f"{root}/sinks/word_counts"
    crashed_after_prepared(bucket, root)
    fs, directory = pafs.FileSystem.from_uri(sink)
    written = fs.get_file_info(pafs.FileSelector(directory))
    lost = sorted(i.path for i in written if i.base_name.startswith(f"abs-e{1:012d}-"))[0]
    fs.delete_file(lost)
    try:
        pipeline(bucket, root).run()
        raise AssertionError("a start committed epoch 1 without its file")
    except UncommittableEpochError as err:
        refusal = str(err)
    problems = [str(p) for p in validate(root)]
    rollback(root, 0)
    replaced = Snapshots(root).get(1).status.value
    pipeline(bucket, root).run()
    for index in range(2, len(EPOCHS)):
        land(bucket, index)
        pipeline(bucket, root).run()
    report = {
        "lost": lost.rsplit("/", 1)[-1],
        "refusal": refusal,
        "problems": problems,
        "replaced": replaced,
        "state": Snapshots(root).state_table("word_count").select(["word", "count"]).to_pylist(),
        "sink": DeltaStore().read(sink, columns=["word", "count"]).to_pylist(),
        "problems_after": [str(p) for p in validate(root)],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
