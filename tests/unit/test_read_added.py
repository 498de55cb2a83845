"""Rows of the files a Delta commit added, as a KafkaSink publishes them."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pyspark_abs.storage.files import read_added
from tests.support.inputs import arrow_schema

SCHEMA = arrow_schema(
    ("user", pa.string()), ("day", pa.date32()), ("n", pa.int64()), ("x", pa.string())
)


def test_partition_values_come_from_the_log_and_newer_columns_are_null(tmp_path: Path) -> None:
    (tmp_path / "day=2026-11-27").mkdir()
    pq.write_table(
        pa.table({"user": ["a", "b"], "n": [1, 2]}), tmp_path / "day=2026-11-27/f.parquet"
    )
    pq.write_table(pa.table({"user": ["c"], "n": [3], "x": ["y"]}), tmp_path / "g.parquet")
    partitions = {
        "day=2026-11-27/f.parquet": (("day", "2026-11-27"),),
        "g.parquet": (("day", "2026-11-28"),),
    }
    rows = read_added(str(tmp_path), ["day=2026-11-27/f.parquet", "g.parquet"], partitions, SCHEMA)
    assert rows.schema == SCHEMA
    assert rows.to_pylist() == [
        {"user": "a", "day": dt.date(2026, 11, 27), "n": 1, "x": None},
        {"user": "b", "day": dt.date(2026, 11, 27), "n": 2, "x": None},
        {"user": "c", "day": dt.date(2026, 11, 28), "n": 3, "x": "y"},
    ]


def test_a_commit_that_added_no_files_has_no_rows(tmp_path: Path) -> None:
    assert read_added(str(tmp_path), [], {}, SCHEMA).num_rows == 0
