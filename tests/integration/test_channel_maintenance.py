"""Delta maintenance on a running job's channels, as users run it on any Delta table: a
``DELETE`` erasing a person's rows, an ``OPTIMIZE``, a ``VACUUM``. Readers follow what they
can (the rows still in the table), refuse what they cannot, and a rollback never brings
erased rows back. Every job snapshot is compared with a model of the input."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pyspark_abs import Snapshots
from pyspark_abs.errors import ExternalChangeError
from pyspark_abs.examples import medallion
from pyspark_abs.job_ledger.manifest import open_job
from pyspark_abs.storage.store import DeltaStore
from tests.support.jobs import FILES, Event, assert_job_matches, job_of


def test_a_job_follows_a_delete_and_an_optimize_on_a_channel_and_refuses_what_it_cannot(
    spark: SparkSession, tmp_path: Path
) -> None:
    medallion.write_events(tmp_path / "in", FILES[:3])
    job = job_of(spark, tmp_path)
    job.run()
    bronze, silver = job.stages["bronze"], job.stages["silver"]
    channel = f"{job.root}/tables/bronze"

    def bronze_alone(files: list[list[Event]]) -> None:
        medallion.write_events(tmp_path / "in", files)
        bronze.start(available_now=True).await_termination()

    # cy asks to be forgotten while epochs 3 and 4 wait in bronze's channel, unread
    bronze_alone(FILES[3:])
    DeltaTable(channel).delete("user = 'cy'")
    job.run()
    erased = [[e for e in events if e[1] != "cy"] for events in FILES]
    assert_job_matches(spark, job, {e: e for e in range(5)}, erased)

    # an OPTIMIZE rewrites every file of the channel, epoch 5's unread one among them
    late: list[Event] = [("e8", "dee", 9), ("e2", "bob", 7)]
    bronze_alone([late])
    DeltaTable(channel).optimize.compact()
    job.run()
    steps = [*erased, late]
    assert_job_matches(spark, job, {e: e for e in range(6)}, steps)

    # going back to before the DELETE would bring cy's rows back: refused, nothing changed
    decisions = len(open_job(DeltaStore(), job.root, None).decisions)
    with pytest.raises(ExternalChangeError, match=r"DELETE at version \d+\), and going back"):
        job.rollback(2)
    manifest = open_job(DeltaStore(), job.root, None)
    assert (len(manifest.decisions), manifest.unfinished) == (decisions, None)
    job.rollback(5)  # after it: the channel keeps the DELETE and the OPTIMIZE
    job.run()
    kept = spark.read.parquet(*DeltaTable(channel).file_uris()).collect()
    assert "cy" not in {r.user for r in kept}

    # a DELETE rewrites a file silver has not read, and a VACUUM deletes it: refused
    bronze_alone([[("e9", "eve", 1), ("e10", "eve", 2)]])  # one file: bronze keys by user
    epochs = [i.epoch for i in Snapshots(silver.root).list()]
    table = DeltaTable(channel)
    table.delete("event_id = 'e9'")
    table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(ExternalChangeError, match=r"then deleted \(a VACUUM\) before this stage"):
        job.run()
    assert [i.epoch for i in Snapshots(silver.root).list()] == epochs
