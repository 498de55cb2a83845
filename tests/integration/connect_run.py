"""The word count through a Spark Connect session, run as its own program.

``python -m tests.integration.connect_run URL WORKDIR`` connects to the Spark Connect server at
``URL``, runs the word count over a Delta table of words (one version per epoch) with a crash
after PREPARED of epoch 1, restarts it, rolls back to epoch 1 and runs again, then restores
epoch 1 into a second root and runs that with other partition and key-group counts. It also
checks that the async committer and a KafkaSink are refused. A client process of its own, because a Connect
session switches pyspark into Connect mode for the whole process. The last line printed is a
JSON object; the test checks the snapshots it left with a classic session.

``python -m tests.integration.connect_run URL WORKDIR --serve`` starts the word count with a
processing-time trigger instead, prints one JSON line once epoch 0 is committed, and then
waits to be killed, leaving the query running in the server.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from pyspark.sql import SparkSession

from pyspark_abs import AbsConfig, DeltaSource, KafkaSink, Pipeline, restore, rollback
from pyspark_abs.errors import ConfigError, InjectedFault, OperatorDefinitionError
from pyspark_abs.examples.wordcount import word_count
from pyspark_abs.faults import Fault, FaultStep
from tests.support.inputs import EPOCHS
from tests.support.pipelines import word_table


def pipeline(words: str, root: Path, *, limit: int | None = 1, **config: object) -> Pipeline:
    """The word count over ``words``, ``limit`` table files per epoch (None: all there are)."""
    settings: dict[str, object] = {"key_groups": 4, "commit_mode": "sync", **config}
    return Pipeline(
        "connect",
        DeltaSource(words, max_files_per_trigger=limit),
        word_count,
        root=str(root),
        sinks=str(root / "sink"),
        config=AbsConfig(**settings),  # type: ignore[arg-type]
    )


def main(url: str, workdir: str) -> int:
    spark = SparkSession.builder.remote(url).getOrCreate()
    base = Path(workdir)
    words = word_table(base / "words", EPOCHS)
    root = base / "root"
    report: dict[str, object] = {"session": type(spark).__module__}
    try:
        pipeline(words, root, commit_mode="async").run()
    except ConfigError as err:
        report["async_refused"] = str(err)
    sunk = base / "sunk"
    kafka = KafkaSink(str(sunk / "sink"), topic="counts", bootstrap_servers="127.0.0.1:9")
    sync = AbsConfig(commit_mode="sync")
    try:
        Pipeline(
            "connect", DeltaSource(words), word_count, root=str(sunk), sinks=kafka, config=sync
        ).run()
    except OperatorDefinitionError as err:
        report["kafka_sink_refused"] = str(err)
    crash = (Fault(FaultStep.AFTER_PREPARED, epoch=1),)
    try:
        pipeline(words, root, faults=crash).run()
        raise AssertionError("the crash after PREPARED of epoch 1 did not happen")
    except InjectedFault as err:
        report["crash"] = type(err).__name__
    restarted = pipeline(words, root).run()
    report["recovered_epochs"] = restarted.recovered_epochs
    report["epochs_run"] = restarted.epochs_run
    latest = restarted.latest_snapshot()
    report["latest_epoch"] = None if latest is None else latest.epoch
    report["rollback_epoch"] = rollback(str(root), 1).epoch
    report["after_rollback_epochs_run"] = pipeline(words, root).run().epochs_run
    restore(str(root), 1, into=str(base / "copy"))
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    report["copy_epochs_run"] = pipeline(words, base / "copy", key_groups=5).run().epochs_run
    spark.stop()
    print(json.dumps(report))
    return 0


def serve(url: str, workdir: str) -> None:
    SparkSession.builder.remote(url).getOrCreate()  # the session the pipeline uses
    base = Path(workdir)
    words = word_table(base / "words", EPOCHS[:1])
    root = base / "served"
    query = pipeline(words, root, limit=None).start(processing_time="1 second")
    deadline = time.monotonic() + 300
    while query.latest_snapshot() is None:
        if time.monotonic() > deadline:
            raise AssertionError("epoch 0 was not committed within 300 s")
        query.await_termination(1)
    print(json.dumps({"client_pid": os.getpid(), "root": str(root), "words": words}), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    if sys.argv[3:] == ["--serve"]:
        serve(sys.argv[1], sys.argv[2])
    sys.exit(main(sys.argv[1], sys.argv[2]))
