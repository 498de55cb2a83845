"""A retry loop with bounded attempts and a dead-letter table.

Jobs stream in from a Delta table. Each attempt calls a flaky service; a job that fails goes
back over the back-edge ``retry``, whose stateless stage increments its attempt number, and
is tried again in a later epoch. A job still failing after ``max_attempts`` attempts goes to
the dead-letter table. Every job ends in exactly one of ``done`` and ``dead_letter``, with
its exact number of attempts, also across crashes: retries in flight are in the snapshot.

Run it as a program (``scripts/examples/retry_loop.py`` does the same)::

    python -m pyspark_abs.examples.retry --root DIR [--jobs N] [--max-attempts K]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pyspark_abs.config import AbsConfig
from pyspark_abs.operators.contract import Operator
from pyspark_abs.operators.key_state import KeyState
from pyspark_abs.operators.per_key import operator
from pyspark_abs.pipeline.backedge import BackEdge
from pyspark_abs.pipeline.declaration import Pipeline
from pyspark_abs.session import local_session
from pyspark_abs.snapshots.reading import Snapshots
from pyspark_abs.sources import DeltaSource

_JOB_FIELDS: list[pa.Field[Any]] = [
    pa.field("job_id", pa.int64()),
    pa.field("payload", pa.string()),
]
JOB_SCHEMA = pa.schema(_JOB_FIELDS)


def attempts_needed(job_id: int) -> int:
    """The flaky service: job ``j`` succeeds on its ``j % 5 + 1``-th attempt."""
    return job_id % 5 + 1


def retry_operator(max_attempts: int, ttl: dt.timedelta | None = None) -> Operator:
    """The per-job operator: try the job, then report it done, retry it, or dead-letter it.

    ``ttl``: how long after a job's last attempt (processing time) its count of attempts is
    forgotten (None: kept).
    """

    @operator(
        key="job_id",
        state_schema="attempts int",
        outputs={
            "done": "job_id long, payload string, attempts int",
            "dead_letter": "job_id long, payload string, attempts int, error string",
            "retry": "job_id long, payload string, attempt int",
        },
        name="attempt_job",
        ttl=ttl,
    )
    def attempt_job(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        (job_id,) = key
        attempts = state.get({"attempts": 0})["attempts"]
        results: dict[str, list[dict[str, Any]]] = {"done": [], "dead_letter": [], "retry": []}
        for payload, attempt in zip(rows["payload"], rows["attempt"], strict=True):
            attempts += 1
            if attempt + 1 >= attempts_needed(job_id):
                results["done"].append({"job_id": job_id, "payload": payload, "attempts": attempts})
            elif attempt + 1 >= max_attempts:
                error = f"service failed {attempts} time(s)"
                results["dead_letter"].append(
                    {"job_id": job_id, "payload": payload, "attempts": attempts, "error": error}
                )
            else:
                results["retry"].append({"job_id": job_id, "payload": payload, "attempt": attempt})
        state.update({"attempts": attempts})
        return results

    return attempt_job


def first_attempt(jobs: DataFrame) -> DataFrame:
    """New jobs start at attempt 0."""
    return jobs.withColumn("attempt", F.lit(0))


def next_attempt(retries: DataFrame) -> DataFrame:
    """The stateless stage on the loop path: a retried job's attempt number goes up."""
    return retries.withColumn("attempt", (F.col("attempt") + 1).cast("int"))


def build(
    spark: SparkSession,
    jobs_table: str,
    root: str,
    *,
    max_attempts: int = 3,
    config: AbsConfig | None = None,
    checkpoint: str | None = None,
    ttl: dt.timedelta | None = None,
) -> Pipeline:
    """The retry pipeline over the job table ``jobs_table`` (``ttl``: see retry_operator)."""
    return Pipeline(
        "retries",
        DeltaSource(jobs_table),
        retry_operator(max_attempts, ttl),
        root=root,
        sinks={"done": f"{root}/sinks/done", "dead_letter": f"{root}/sinks/dead_letter"},
        back_edges=[BackEdge("retry", transform=next_attempt)],
        transform=first_attempt,
        config=config,
        checkpoint=checkpoint,
    )


def expected_outcome(job_ids: Sequence[int], max_attempts: int) -> dict[int, tuple[str, int]]:
    """Where each job must end, and after how many attempts."""
    return {
        j: ("done", attempts_needed(j))
        if attempts_needed(j) <= max_attempts
        else ("dead_letter", max_attempts)
        for j in job_ids
    }


def write_jobs(table: str, count: int, *, first: int = 0) -> None:
    """Append ``count`` jobs with ids from ``first`` to the job table."""
    from deltalake import write_deltalake

    ids = list(range(first, first + count))
    rows = pa.table({"job_id": ids, "payload": [f"job-{i}" for i in ids]}, schema=JOB_SCHEMA)
    write_deltalake(table, rows, mode="append")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the retry loop until quiescent and check every job's outcome."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="snapshot root (input and sinks inside)")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--max-attempts", type=int, default=3)
    args = parser.parse_args(argv)
    table = str(Path(args.root) / "input" / "jobs")
    if not Path(table).exists():
        write_jobs(table, args.jobs)
    spark = local_session("retries", shuffle_partitions=2)
    pipeline = build(spark, table, args.root, max_attempts=args.max_attempts)
    outcome = pipeline.run_until_quiescent()
    snapshots = Snapshots(args.root, spark)
    found = {
        (r["job_id"]): (name, r["attempts"])
        for name in ("done", "dead_letter")
        for r in snapshots.sink(name).collect()
    }
    rows = sum(snapshots.sink(name).count() for name in ("done", "dead_letter"))
    expected = expected_outcome(range(args.jobs), args.max_attempts)
    report = {
        "jobs": args.jobs,
        "done": sum(1 for kind, _ in found.values() if kind == "done"),
        "dead_letter": sum(1 for kind, _ in found.values() if kind == "dead_letter"),
        "duplicates": rows - len(found),
        "wrong": sum(found.get(j) != want for j, want in expected.items()),
        "quiescent_epoch": outcome.epoch,
        "seconds": round(outcome.seconds, 1),
    }
    print(json.dumps(report))
    return 0 if report["wrong"] == 0 and report["duplicates"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
