"""The word count publishing to a Kafka topic from an outbox table on S3, as its own program.

``python -m tests.integration.s3_kafka_run BUCKET SERVERS TOPIC`` keeps the landing
directory, the snapshot root, Spark's checkpoint and the ``KafkaSink``'s table under
``BUCKET`` (an ``s3://`` URI) and publishes to ``TOPIC`` on the broker at ``SERVERS``. It
lands one file per run, fails during the publication of epoch 1 (the epoch stays committed,
its Kafka transaction open), starts again, which publishes epoch 1, then lands and runs a
third file. It prints one JSON line. Its own program for the reason
:mod:`tests.integration.s3_run` gives.
"""

from __future__ import annotations

import json
import sys

from pyspark_abs import KafkaSink, Snapshots
from pyspark_abs.errors import InjectedFault
from pyspark_abs.faults import FaultStep
from pyspark_abs.session import local_session
from tests.support.s3 import land, pipeline


def main(bucket: str, servers: str, topic: str) -> None:
    local_session("s3 kafka sink", shuffle_partitions=2)
    root = f"{bucket}/root"
    sink = KafkaSink(
        f"{root}/sinks/word_counts", topic=topic, bootstrap_servers=servers, key="word"
    )
    land(bucket, 0)
    pipeline(bucket, root, sink=sink).run()
    land(bucket, 1)
    try:
        pipeline(bucket, root, sink=sink, crash=1, step=FaultStep.DURING_PUBLISH).run()
        raise AssertionError("the failure during the publication of epoch 1 did not happen")
    except InjectedFault:
        pass
    failed = Snapshots(root).list()[-1].epoch
    land(bucket, 2)
    pipeline(bucket, root, sink=sink).run()
    epochs = [s.epoch for s in Snapshots(root).list()]
    print(json.dumps({"committed_at_failure": failed, "epochs": epochs}))


if __name__ == "__main__":
    main(*sys.argv[1:])
