"""The medallion job through a Spark Connect session, run as its own program.

``python -m tests.integration.connect_job URL WORKDIR`` connects to the Spark Connect server
at ``URL`` and starts the job streaming over three event files (every stage on a fresh
checkpoint: the later stages wait for their first epoch), then lands two more files and
starts it streaming again (every stage continues its checkpoint and starts at once). A
client process of its own, because a Connect session switches pyspark into Connect mode for
the whole process. The last line printed is a JSON object; the test checks the job
snapshots it left with a classic session.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from pyspark_abs import AbsConfig
from pyspark_abs.examples import medallion
from tests.support.jobs import FILES, run_streaming


def main(url: str, workdir: str) -> int:
    spark = SparkSession.builder.remote(url).getOrCreate()
    base = Path(workdir)
    medallion.write_events(base / "in", FILES[:3])
    config = AbsConfig(key_groups=4, commit_mode="sync")
    job = medallion.build(spark, str(base / "in"), str(base / "job"), config=config)
    waiting_first = run_streaming(job)
    medallion.write_events(base / "in", FILES[3:])
    waiting_again = run_streaming(job)
    report = {
        "session": type(spark).__module__,
        "waiting_at_first_start": waiting_first,
        "waiting_at_second_start": waiting_again,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
