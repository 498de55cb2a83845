"""An event-time TTL operator through a Spark Connect session, run as its own program.

``python -m tests.integration.connect_ttl URL WORKDIR`` connects to the Spark Connect server
at ``URL``, sets the session time zone to Asia/Kolkata, runs the TTL count of
:mod:`tests.support.ttl` over its first two batches, rolls back to epoch 0, lands
the other batches and runs again with the same count in the Arrow form. A client process of its own, because a Connect session
switches pyspark into Connect mode for the whole process. The last line printed is a JSON
object; the test checks the snapshots it left with a classic session, against the model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from pyspark_abs import rollback
from tests.support.pipelines import event_table
from tests.support.ttl import BATCHES, recent, recent_arrow, ttl_pipeline

ZONE = "Asia/Kolkata"


def main(url: str, workdir: str) -> int:
    spark = SparkSession.builder.remote(url).getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", ZONE)
    base = Path(workdir)
    events, root = str(base / "events"), base / "root"
    event_table(Path(events), BATCHES[:2])
    first = ttl_pipeline(events, root, recent).run().epochs_run
    rolled_back_to = rollback(str(root), 0).epoch
    event_table(Path(events), BATCHES[2:])
    after = ttl_pipeline(events, root, recent_arrow).run().epochs_run
    report = {
        "session": type(spark).__module__,
        "zone": spark.conf.get("spark.sql.session.timeZone"),
        "epochs_run": [first, after],
        "rollback_epoch": rolled_back_to,
    }
    spark.stop()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
