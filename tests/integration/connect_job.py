"""The medallion job through a Spark Connect session, run as its own program.

``python -m tests.integration.connect_job URL WORKDIR`` connects to the Spark Connect server
at ``URL``, runs the job over three event files, lands two more and starts it streaming
(every stage continues its checkpoint), then rolls the job back to job snapshot 1 and
starts it streaming again (every stage on a fresh checkpoint). A client process of its own,
because a Connect session switches pyspark into Connect mode for the whole process. The
last line printed is a JSON object; the test checks the job snapshots it left with a
classic session.
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
    job.run()
    medallion.write_events(base / "in", FILES[3:])
    query = job.start()
    waiting = query.waiting
    try:
        query.process_all_available()
    finally:
        query.stop()
    rollback = job.rollback(1)
    run_streaming(job)
    report = {
        "session": type(spark).__module__,
        "waiting_at_start": waiting,
        "restore_epoch": rollback.restore_epoch,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
