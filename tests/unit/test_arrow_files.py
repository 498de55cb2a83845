"""Locations delta-rs gives, as paths within pyarrow's file systems, and reading their files."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pyspark_abs.operators.arrow_files import arrow_path, read_parquet


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


def _write(path: Path, table: pa.Table) -> str:
    pq.write_table(table, path)
    return str(path)


SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("tags", pa.list_(pa.struct([("k", pa.string()), ("v", pa.int32())]))),
        pa.field("at", pa.timestamp("us", tz="UTC")),
    ],
    metadata={b"origin": b"manifest"},
)


@pytest.mark.parametrize(
    "second",
    [
        # every column, of the table's types, in another order and with one more column
        pa.table(
            {
                "extra": [1.5],
                "at": pa.array([0], pa.timestamp("us", tz="UTC")),
                "id": [7],
                "tags": pa.array([[{"k": "a", "v": 1}]], SCHEMA.field("tags").type),
            }
        ),
        # a file written before a column was added
        pa.table({"id": [7], "tags": pa.array([None], SCHEMA.field("tags").type)}),
        # a column of another type, which the dataset reader casts
        pa.table(
            {
                "id": pa.array([7], pa.int32()),
                "tags": pa.array([[]], SCHEMA.field("tags").type),
                "at": pa.array([0], pa.timestamp("ms", tz="UTC")),
            }
        ),
    ],
    ids=["same-columns", "missing-column", "other-type"],
)
@pytest.mark.parametrize("columns", [None, ["at", "id"]])
def test_files_read_as_pyarrows_dataset_reader_reads_them(
    tmp_path: Path, second: pa.Table, columns: list[str] | None
) -> None:
    first = pa.table(
        {
            "id": [1, 2],
            "tags": pa.array([[{"k": "x", "v": 3}], None], SCHEMA.field("tags").type),
            "at": pa.array([5, None], pa.timestamp("us", tz="UTC")),
        },
        schema=SCHEMA,
    )
    paths = [_write(tmp_path / "0.parquet", first), _write(tmp_path / "1.parquet", second)]
    expected = pq.read_table(paths, columns=columns, schema=SCHEMA)
    found = read_parquet(paths, columns, SCHEMA)
    assert found.schema.equals(expected.schema, check_metadata=True)
    assert found.equals(expected)
