"""The exactly-once word count on a multi-process Spark cluster, run as its own program.

``python -m tests.integration.distributed_run WORKDIR`` starts ``local-cluster[2,1,1024]``
(a master, two workers and one executor process each, from pyspark's own jars), runs the
word count with a pre-commit task failure and a crash after PREPARED, restarts it, and checks
state and sink against the input exactly as the local tests do. The last line printed is a
JSON object with the executors and the tasks each ran.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from pyspark_abs.errors import InjectedFault
from pyspark_abs.faults import Fault, FaultStep
from tests.support.inputs import EPOCHS, write_epochs
from tests.support.pipelines import assert_word_counts, word_pipeline


def main(workdir: str) -> int:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .appName("pyspark-abs-distributed")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    base = Path(workdir)
    inputs = write_epochs(base / "in", EPOCHS)
    root = base / "root"
    faults = (Fault(FaultStep.PRECOMMIT_TASK, epoch=0), Fault(FaultStep.AFTER_PREPARED, epoch=1))
    try:
        word_pipeline(inputs, root, commit_mode="async", faults=faults).run()
        raise AssertionError("the crash after PREPARED of epoch 1 did not happen")
    except InjectedFault:
        pass
    restarted = word_pipeline(inputs, root, commit_mode="async").run()
    assert restarted.recovered_epochs == [1], restarted.recovered_epochs
    assert_word_counts(spark, root, EPOCHS)
    executors = spark.sparkContext._jsc.sc().statusStore().executorList(True)
    tasks = {
        str(executors.apply(i).id()): int(executors.apply(i).totalTasks())
        for i in range(executors.size())
    }
    spark.stop()
    print(json.dumps({"tasks_by_executor": tasks}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
