"""Delta Lake's own reader (delta-spark) on every table pyspark-abs writes with delta-rs.

``scripts/test_spark_versions`` runs them (marker ``delta_jvm``) on the oldest and the newest
older Spark with a session that carries Delta Lake's jars, SQL extension and catalog
(``ABS_DELTA_JARS``); no Delta release supports the newest Spark yet, so the whole-suite run
on it skips them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import MapType

from pyspark_abs import compact, rollback, vacuum
from pyspark_abs.examples import medallion
from pyspark_abs.job_ledger.manifest import job_manifest_uri
from pyspark_abs.manifest.table import open_root
from pyspark_abs.storage.root import SnapshotRoot, sink_table
from pyspark_abs.storage.spark import load_with_delta_rs
from pyspark_abs.storage.store import DeltaStore
from tests.support.inputs import EPOCHS
from tests.support.jobs import FILES, job_of
from tests.support.versions import files_pipeline, land_and_run, older, sink_of

pytestmark = pytest.mark.delta_jvm


def assert_reads_alike(spark: SparkSession, uri: str, version: int) -> None:
    """delta-spark at ``version`` returns what pyspark-abs's own reader returns."""
    jvm = spark.read.format("delta").option("versionAsOf", version).load(uri)
    own = load_with_delta_rs(spark, uri, version)
    assert_df_equality(sortable(jvm), sortable(own), ignore_row_order=True, ignore_nullable=True)


def sortable(frame: DataFrame) -> DataFrame:
    """``frame`` with its map columns as sorted entry arrays (Spark cannot order maps)."""
    return frame.select(
        *(
            F.array_sort(F.map_entries(f.name)).alias(f.name)
            if isinstance(f.dataType, MapType)
            else F.col(f.name)
            for f in frame.schema.fields
        )
    )


def history(spark: SparkSession, uri: str) -> set[int]:
    """The versions ``DESCRIBE HISTORY`` lists."""
    return {row.version for row in spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()}


def assert_every_snapshot_reads_alike(spark: SparkSession, root: str) -> int:
    """Each table of each snapshot of ``root``, at its recorded version; returns the count."""
    checked = 0
    for entry in open_root(DeltaStore(), SnapshotRoot(root)).snapshots():
        for table, version in entry.table_versions.items():
            uri = entry.tables[table]
            assert_reads_alike(spark, uri, version)
            assert version in history(spark, uri), (root, table, version)
            checked += 1
    return checked


def test_every_table_of_a_pipeline_reads_alike_with_delta_spark_at_every_snapshot(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    spark = delta_spark
    landing, root = tmp_path / "landing", tmp_path / "root"
    land_and_run(landing, root, EPOCHS[:2])
    land_and_run(landing, root, EPOCHS[2:], first=2)
    rollback(str(root), 0)
    files_pipeline(root, landing).run()
    compact(str(root))

    assert assert_every_snapshot_reads_alike(spark, str(root)) >= 6
    manifest = f"{root}/_manifest"
    latest = DeltaStore().open(manifest).version()
    assert_reads_alike(spark, manifest, latest)


def test_every_table_of_a_job_reads_alike_with_delta_spark(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    spark = delta_spark
    if older(spark):
        pytest.skip("jobs need Spark 4.2")
    medallion.write_events(tmp_path / "in", FILES[:3])
    job = job_of(spark, tmp_path)
    job.run()
    for stage in job.stages.values():
        assert assert_every_snapshot_reads_alike(spark, stage.root) >= 3, stage.name
    manifest = job_manifest_uri(job.root)
    assert_reads_alike(spark, manifest, DeltaStore().open(manifest).version())


def downstream(
    spark: SparkSession, sink: str, checkpoint: Path, **options: str
) -> list[tuple[str, int]]:
    """A plain Delta stream on ``sink`` (availableNow): the rows it delivers this time."""
    seen: list[tuple[str, int]] = []
    (
        spark.readStream.format("delta")
        .options(**options)
        .load(sink)
        .writeStream.foreachBatch(
            lambda batch, _: seen.extend((r.word, r["count"]) for r in batch.collect())
        )
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )
    return seen


def rows(spark: SparkSession, sink: str, version: int | None = None) -> list[tuple[str, int]]:
    """The sink's rows (at ``version``), read with delta-spark."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return [(r.word, r["count"]) for r in reader.load(sink).collect()]


def test_a_downstream_delta_stream_on_a_sink_reads_every_epoch_once_across_maintenance(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    spark = delta_spark
    landing, root = tmp_path / "landing", tmp_path / "root"
    sink = sink_of(root)
    seen: list[tuple[str, int]] = []
    for first in range(len(EPOCHS)):
        land_and_run(landing, root, EPOCHS[first : first + 1], first=first)
        compact(str(root))
        vacuum(str(root), keep_last=1, min_age_seconds=0)
        seen += downstream(spark, sink, tmp_path / "downstream")
    assert sorted(seen) == sorted(rows(spark, sink))
    assert len(seen) == len(set(seen)) > 0


def test_after_a_rollback_a_downstream_stream_needs_skip_change_commits_and_sees_reruns_again(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    spark = delta_spark
    landing, root = tmp_path / "landing", tmp_path / "root"
    sink = sink_of(root)
    land_and_run(landing, root, EPOCHS[:1])
    land_and_run(landing, root, EPOCHS[1:2], first=1)
    skip = {"skipChangeCommits": "true"}
    delivered = downstream(spark, sink, tmp_path / "plain")
    assert downstream(spark, sink, tmp_path / "skipping", **skip) == delivered
    rolled_back = Counter(delivered) - Counter(rows(spark, sink, first_version(root)))

    rollback(str(root), 0)
    files_pipeline(root, landing).run()
    with pytest.raises(StreamingQueryException, match="DELTA_SOURCE_IGNORE_DELETE"):
        downstream(spark, sink, tmp_path / "plain")
    again = downstream(spark, sink, tmp_path / "skipping", **skip)
    assert Counter(again) == rolled_back  # the re-run epoch's rows, delivered a second time
    assert Counter(delivered) + Counter(again) - rolled_back == Counter(rows(spark, sink))


def first_version(root: Path) -> int:
    """The sink's version as of epoch 0."""
    (entry,) = [e for e in open_root(DeltaStore(), SnapshotRoot(root)).snapshots() if e.epoch == 0]
    return entry.table_versions[sink_table("output")]


def test_a_lagging_stream_on_a_sink_reads_every_row_once_across_a_rollback_and_vacuum(
    delta_spark: SparkSession, tmp_path: Path
) -> None:
    """The reader was caught up at epoch 2; epochs 3 and 4 ran, were rolled back, and three
    more ran; vacuum then keeps the rolled-back epochs' files (removed moments ago), so the
    reader delivers what Delta's log says it must: each commit's added rows once, the
    rollback's commit skipped. Delta's own VACUUM would keep them for 7 days too."""
    spark = delta_spark
    landing, root = tmp_path / "landing", tmp_path / "root"
    sink = sink_of(root)
    skip = {"skipChangeCommits": "true"}

    def land(first: int) -> None:
        text = EPOCHS[first % len(EPOCHS)]
        land_and_run(landing, root, [text], first=first)

    for first in range(3):
        land(first)
    delivered = downstream(spark, sink, tmp_path / "lagging", **skip)
    caught_up = latest(sink)
    for first in range(3, 5):
        land(first)
    rollback(str(root), 2)
    for first in range(5, 8):
        land(first)
    before = {v: sorted(rows(spark, sink, v)) for v in range(caught_up, latest(sink) + 1)}

    vacuum(str(root), keep_last=2)

    delivered += downstream(spark, sink, tmp_path / "lagging", **skip)
    assert {v: sorted(rows(spark, sink, v)) for v in before} == before
    expected = Counter(rows(spark, sink, caught_up))
    for version in range(caught_up + 1, latest(sink) + 1):
        expected += Counter(streamed_rows(spark, sink, version))
    assert Counter(delivered) == expected


def latest(sink: str) -> int:
    return int(DeltaTable(sink).version())


def streamed_rows(spark: SparkSession, sink: str, version: int) -> list[tuple[str, int]]:
    """What a Delta stream with ``skipChangeCommits`` delivers of a commit, read from the
    log: nothing if it removes data, else the rows of the files it adds as data changes."""
    log = Path(sink) / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines() if line]
    if any(a.get("remove", {}).get("dataChange") for a in actions):
        return []
    paths = [
        f"{sink}/{unquote(a['add']['path'])}" for a in actions if a.get("add", {}).get("dataChange")
    ]
    if not paths:
        return []
    return [(r.word, r["count"]) for r in spark.read.parquet(*paths).collect()]
