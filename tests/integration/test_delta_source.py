"""The Delta stream source over real Spark and real Delta tables written with delta-rs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.datasource import CaseInsensitiveDict

from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.sources import DeltaSource
from pyspark_abs.sources.delta.offsets import Offset
from pyspark_abs.sources.delta.stream import DeltaDataSource
from pyspark_abs.sources.readers import ReadAllAvailable, ReadMaxRows

DDL = "id long, name string"
PARTITIONED_DDL = "id long, name string, region string, bucket int"


def rows(ids: Sequence[int]) -> pa.Table:
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "name": pa.array([f"n{i}" for i in ids], pa.string())}
    )


def append(path: Path, ids: Sequence[int], **kwargs: Any) -> None:
    write_deltalake(str(path), rows(ids), mode=kwargs.pop("mode", "append"), **kwargs)


def table_of(path: Path, *versions: Sequence[int]) -> Path:
    """A table with one append (one file) per element of ``versions``: versions 0, 1, ..."""
    for ids in versions:
        append(path, ids)
    return path


def run(frame: DataFrame, checkpoint: Path) -> list[list[Row]]:
    """Run the stream with availableNow to its end; the rows of every micro-batch."""
    batches: list[list[Row]] = []
    ids: list[int] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        ids.append(batch_id)
        batches.append(batch.collect())

    query = (
        frame.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert all(b == a + 1 for a, b in pairwise(ids)), ids
    return batches


def assert_rows(
    spark: SparkSession, actual: Sequence[Row], expected: Sequence[tuple[Any, ...]], ddl: str = DDL
) -> None:
    assert_df_equality(
        spark.createDataFrame(list(actual), ddl),
        spark.createDataFrame(list(expected), ddl),
        ignore_row_order=True,
    )


def named(ids: Sequence[int]) -> list[tuple[int, str]]:
    return [(i, f"n{i}") for i in ids]


def flat(batches: Sequence[Sequence[Row]]) -> list[Row]:
    return [row for batch in batches for row in batch]


def offset_line(checkpoint: Path, batch: int) -> str:
    """The first source's offset at the end of ``batch``, as Spark wrote it."""
    return (checkpoint / "offsets" / str(batch)).read_text().splitlines()[2]


def test_max_rows_reads_every_row_once_in_limited_batches(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = table_of(tmp_path / "t", range(0, 10), range(10, 20), range(20, 30))
    frame = DeltaSource(str(path), max_rows_per_trigger=7).load(spark)
    assert frame.isStreaming
    assert frame.schema.simpleString() == "struct<id:bigint,name:string>"

    batches = run(frame, tmp_path / "ck")

    assert [len(b) for b in batches] == [7, 7, 7, 7, 2]
    assert_rows(spark, flat(batches), named(range(30)))
    assert DeltaSource.offset_of(offset_line(tmp_path / "ck", 1)) == Offset(1, 4).to_dict()


def test_max_files_reads_whole_files_per_batch(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    data = rows(range(12)).append_column("part", pa.array([i % 3 for i in range(12)], pa.int64()))
    write_deltalake(str(path), data, partition_by=["part"])
    write_deltalake(str(path), data.slice(0, 2), partition_by=["part"], mode="append")

    batches = run(DeltaSource(str(path), max_files_per_trigger=2).load(spark), tmp_path / "ck")

    assert [len(b) for b in batches] == [8, 5, 1]
    assert_rows(
        spark,
        flat(batches),
        [(i, f"n{i}", i % 3) for i in [*range(12), 0, 1]],
        "id long, name string, part long",
    )


def test_restart_reads_only_new_rows(spark: SparkSession, tmp_path: Path) -> None:
    path = table_of(tmp_path / "t", range(0, 5), range(5, 10))
    source = DeltaSource(str(path), max_rows_per_trigger=4)
    assert_rows(spark, flat(run(source.load(spark), tmp_path / "ck")), named(range(10)))

    append(path, range(10, 16))
    append(path, range(16, 18))
    again = run(source.load(spark), tmp_path / "ck")

    assert [len(b) for b in again] == [4, 4]
    assert_rows(spark, flat(again), named(range(10, 18)))
    assert run(source.load(spark), tmp_path / "ck") == []


def test_starting_offset_from_a_checkpoint_starts_a_new_checkpoint_after_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = table_of(tmp_path / "t", range(0, 10), range(10, 20), range(20, 30))
    first = run(DeltaSource(str(path), max_rows_per_trigger=6).load(spark), tmp_path / "ck1")
    offset = DeltaSource.offset_of(offset_line(tmp_path / "ck1", 2))
    assert offset == Offset(1, 8).to_dict()

    second = run(DeltaSource(str(path)).load(spark, starting_offset=offset), tmp_path / "ck2")

    assert_rows(spark, flat(second), named(range(18, 30)))
    assert_rows(spark, flat(second), flat(first[3:]))


def test_starting_and_ending_version(spark: SparkSession, tmp_path: Path) -> None:
    path = table_of(tmp_path / "t", range(0, 3), range(3, 6), range(6, 9), range(9, 12))
    source = DeltaSource(str(path), starting_version=1, ending_version=2, max_files_per_trigger=1)

    batches = run(source.load(spark), tmp_path / "ck")

    assert [len(b) for b in batches] == [3, 3]
    assert_rows(spark, flat(batches), named(range(3, 9)))


def test_partition_columns_are_typed(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    regions = ["north east", "south", None, "south", "north east", "west"]
    data = rows(range(6)).append_column("region", pa.array(regions, pa.string()))
    data = data.append_column("bucket", pa.array([i % 2 for i in range(6)], pa.int32()))
    write_deltalake(str(path), data.slice(0, 4), partition_by=["region", "bucket"])
    write_deltalake(str(path), data.slice(4), partition_by=["region", "bucket"], mode="append")

    frame = DeltaSource(str(path), max_rows_per_trigger=2).load(spark)
    assert frame.schema.simpleString() == ("struct<id:bigint,name:string,region:string,bucket:int>")
    batches = run(frame, tmp_path / "ck")

    assert [len(b) for b in batches] == [2, 2, 2]
    expected = [(i, f"n{i}", regions[i], i % 2) for i in range(6)]
    assert_rows(spark, flat(batches), expected, PARTITIONED_DDL)


def change_commits(path: Path) -> None:
    """Version 0: 0..9; 1: delete id < 3; 2: 10..14; 3: overwrite with 100..101; 4: 20..21."""
    append(path, range(10))
    DeltaTable(str(path)).delete("id < 3")
    append(path, range(10, 15))
    append(path, [100, 101], mode="overwrite")
    append(path, [20, 21])


def test_a_change_commit_fails_the_query_after_the_rows_before_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    change_commits(path)
    batches: list[list[Row]] = []
    query = (
        DeltaSource(str(path))
        .load(spark)
        .writeStream.foreachBatch(lambda batch, _: batches.append(batch.collect()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )

    with pytest.raises(StreamingQueryException) as failure:
        query.awaitTermination()

    message = str(failure.value)
    assert "SourceError: version 1 of Delta table" in message
    assert "removes data (DELETE" in message
    assert "skip_change_commits=True" in message
    assert_rows(spark, flat(batches), named(range(10)))


def test_skip_change_commits_skips_their_files(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    change_commits(path)

    batches = run(DeltaSource(str(path), skip_change_commits=True).load(spark), tmp_path / "ck")

    assert_rows(spark, flat(batches), named([*range(15), 20, 21]))


def test_ignore_changes_reads_the_files_change_commits_add(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    change_commits(path)

    batches = run(DeltaSource(str(path), ignore_changes=True).load(spark), tmp_path / "ck")

    rewritten = range(3, 10)
    assert_rows(spark, flat(batches), named([*range(15), *rewritten, 100, 101, 20, 21]))


def test_a_schema_change_after_the_start_fails_the_query(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = table_of(tmp_path / "t", range(3))
    frame = DeltaSource(str(path)).load(spark)
    wider = rows([3]).append_column("extra", pa.array([1.5]))
    write_deltalake(str(path), wider, mode="append", schema_mode="merge")

    with pytest.raises(StreamingQueryException, match="changed at version 1") as failure:
        run(frame, tmp_path / "ck")
    assert "Restart the query with a new checkpoint" in str(failure.value)

    batches = run(DeltaSource(str(path)).load(spark), tmp_path / "ck2")
    assert_rows(
        spark,
        flat(batches),
        [(0, "n0", None), (1, "n1", None), (2, "n2", None), (3, "n3", 1.5)],
        "id long, name string, extra double",
    )


def test_a_cleaned_up_log_names_the_version_and_a_newer_start(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = table_of(tmp_path / "t", range(0, 2), range(2, 4), range(4, 6))
    DeltaTable(str(path)).create_checkpoint()
    (path / "_delta_log" / f"{0:020d}.json").unlink()

    with pytest.raises(StreamingQueryException) as failure:
        run(DeltaSource(str(path)).load(spark), tmp_path / "ck")
    message = str(failure.value)
    assert "the log of version 0 of Delta table" in message
    assert "starting_version=1" in message

    batches = run(DeltaSource(str(path), starting_version=1).load(spark), tmp_path / "ck2")
    assert_rows(spark, flat(batches), named(range(2, 6)))


def test_available_now_pins_the_latest_version(tmp_path: Path) -> None:
    path = table_of(tmp_path / "t", range(2))
    source = DeltaSource(str(path), max_rows_per_trigger=1)
    data_source = DeltaDataSource(CaseInsensitiveDict(source._options()))
    reader = data_source.streamReader(data_source.schema())
    reader.prepareForTriggerAvailableNow()
    append(path, range(2, 4))

    start = reader.initialOffset()
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == Offset(0, 1).to_dict()
    assert reader.latestOffset(start, ReadAllAvailable()) == Offset(1, 0).to_dict()
    end = Offset(1, 0).to_dict()
    assert reader.latestOffset(end, ReadAllAvailable()) == end
    assert len(reader.partitions(start, end)) == 1


def test_row_counts_without_stats_come_from_the_parquet_footer(tmp_path: Path) -> None:
    path = table_of(tmp_path / "t", range(3))
    table = DeltaTable(str(path))
    pq.write_table(rows(range(3, 8)), path / "no-stats.parquet")
    size = (path / "no-stats.parquet").stat().st_size
    add = AddAction("no-stats.parquet", size, {}, 0, True, "")
    table.create_write_transaction([add], mode="append", schema=table.schema())
    source = DeltaSource(str(path))
    data_source = DeltaDataSource(CaseInsensitiveDict(source._options()))
    reader = data_source.streamReader(data_source.schema())

    start = Offset(0, 2).to_dict()
    end = reader.latestOffset(start, ReadMaxRows(4))
    assert end == Offset(1, 3).to_dict()
    assert reader.latestOffset(end, ReadAllAvailable()) == Offset(2, 0).to_dict()
    read = [
        row["id"]
        for part in reader.partitions(start, Offset(2, 0).to_dict())
        for batch in reader.read(part)
        for row in batch.to_pylist()
    ]
    assert read == [2, 3, 4, 5, 6, 7]


def test_missing_table_and_bad_options(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"no Delta table at .*missing"):
        DeltaSource(str(tmp_path / "missing")).load(spark)

    path = table_of(tmp_path / "t", range(2), range(2, 4))
    with pytest.raises(ConfigError, match=r"starting_version 2 is beyond .* latest version 1"):
        DeltaSource(str(path), starting_version=2).load(spark)
    with pytest.raises(ConfigError, match="not both"):
        DeltaSource(str(path), max_rows_per_trigger=1, max_files_per_trigger=1)
    with pytest.raises(ConfigError, match="max_rows_per_trigger must be a positive integer"):
        DeltaSource(str(path), max_rows_per_trigger=-1)
    with pytest.raises(ConfigError, match="ending_version 0 is before starting_version 1"):
        DeltaSource(str(path), starting_version=1, ending_version=0)
    with pytest.raises(ConfigError, match="bad starting_offset"):
        DeltaSource(str(path)).load(spark, starting_offset={"logOffset": 3})
    with pytest.raises(ConfigError, match="beyond the table's latest version 1"):
        DeltaSource(str(path)).load(spark, starting_offset=Offset(5, 0).to_dict())
    with pytest.raises(ConfigError, match="not an offset"):
        DeltaSource.offset_of(json.dumps({"logOffset": 3}))
