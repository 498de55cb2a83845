"""Locations delta-rs gives, as paths within pyarrow's file systems."""

import pytest

from pyspark_abs.operators.arrow_files import arrow_path


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("/data/root/t/part-0.parquet", "/data/root/t/part-0.parquet"),
        ("file:///data/root/t/part-0.parquet", "/data/root/t/part-0.parquet"),
        ("s3://bucket/root/t/part-0.parquet", "bucket/root/t/part-0.parquet"),
        ("gs://bucket/root/part-0.parquet", "bucket/root/part-0.parquet"),
        ("abfss://box@acct.dfs.core.windows.net/root/p.parquet", "box/root/p.parquet"),
    ],
)
def test_a_table_file_location_becomes_its_file_system_path(uri: str, path: str) -> None:
    assert arrow_path(uri) == path
