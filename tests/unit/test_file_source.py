"""The replayable file source without Spark: reading order, offsets, late files, formats."""

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pyspark_abs import FileSource
from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.sources.files.offsets import (
    NOTHING,
    START,
    FileOffset,
    Format,
    Landed,
    list_files,
    next_files,
    read_file,
    require_folder,
)
from pyspark_abs.sources.rewind import unrewindable

A, B, C, D = Landed(10, "a.json"), Landed(20, "b.json"), Landed(20, "c.json"), Landed(30, "0.json")


def test_files_are_read_by_modification_time_then_name() -> None:
    listing = [D, C, A, B]
    assert next_files(listing, START) == [A, B, C, D]
    assert next_files(listing, START, max_files=2) == [A, B]
    after_b = FileOffset(2, B)
    assert next_files(listing, after_b) == [C, D]
    assert next_files(listing, after_b, until=C) == [C]
    assert next_files(listing, after_b, until=NOTHING) == []
    assert next_files([A, B], after_b) == []
    assert next_files([B, C], after_b) == [C]  # a file read before was deleted: fine


def test_a_late_file_stops_the_stream_instead_of_being_skipped() -> None:
    late = Landed(15, "late.json")
    with pytest.raises(
        ValueError,
        match=r"1 file\(s\) landed .* before b.json \(file 2 of those read\); .* "
        r"\['late.json', 'a.json'\]",
    ):
        next_files([A, B, C, late], FileOffset(2, B))


def test_offsets_round_trip_and_bad_ones_are_refused() -> None:
    for offset in (START, FileOffset(3, C)):
        text = json.dumps(offset.to_dict())
        assert FileSource.offset_of(text) == offset
        assert unrewindable(text) == []
    with pytest.raises(ConfigError, match="is not an offset of pyspark_abs_files"):
        FileSource.offset_of(json.dumps({"logOffset": 3}))
    with pytest.raises(ConfigError, match="files must be an integer >= 0"):
        FileSource.offset_of(json.dumps({**START.to_dict(), "files": -1}))


def test_every_format_reads_with_the_declared_schema(tmp_path: Path) -> None:
    fields: list[pa.Field[pa.DataType]] = [pa.field("word", pa.string()), pa.field("n", pa.int64())]
    schema = pa.schema(fields)
    want = pa.table({"word": ["a", "b"], "n": [1, None]}, schema=schema)
    (tmp_path / "x.json").write_text('{"word": "a", "n": 1, "extra": 0}\n{"word": "b"}\n')
    (tmp_path / "x.csv").write_text("n,word\n1,a\n,b\n")
    (tmp_path / "y.csv").write_text("a,1\nb,\n")
    pq.write_table(want, tmp_path / "x.parquet")
    (tmp_path / "x.txt").write_text("one line\nanother\n")
    assert read_file(str(tmp_path / "x.json"), "json", schema).equals(want)
    assert read_file(str(tmp_path / "x.csv"), "csv", schema).equals(want)
    assert read_file(str(tmp_path / "y.csv"), "csv", schema, header=False).equals(want)
    assert read_file(str(tmp_path / "x.parquet"), "parquet", schema).equals(want)
    text = read_file(str(tmp_path / "x.txt"), "text", pa.schema([pa.field("value", pa.string())]))
    assert text.column("value").to_pylist() == ["one line", "another"]


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_an_empty_file_has_no_rows_as_in_spark(tmp_path: Path, fmt: Format) -> None:
    schema = pa.schema([pa.field("word", pa.string())])
    (tmp_path / "empty").write_text("")
    assert read_file(str(tmp_path / "empty"), fmt, schema).equals(schema.empty_table())


def test_listing_skips_hidden_and_temporary_files(tmp_path: Path) -> None:
    for name in ("b.json", "a.json", ".a.json.crc", "_tmp.json"):
        (tmp_path / name).write_text("{}\n")
    os.utime(tmp_path / "b.json", ns=(1, 1))
    assert [f.name for f in sorted(list_files(str(tmp_path)))] == ["b.json", "a.json"]
    assert list_files(str(tmp_path / "missing")) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"format": "orc", "schema": "a int"}, "format must be one of"),
        ({"format": "json"}, "json files need a schema"),
        ({"format": "text", "schema": "a int"}, "text files have the schema 'value string'"),
        ({"format": "csv", "schema": "a int", "max_files_per_trigger": 0}, "positive integer"),
    ],
)
def test_bad_declarations_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FileSource("/in", **kwargs)  # type: ignore[arg-type]


def test_a_missing_folder_or_a_file_is_refused_with_what_to_do(tmp_path: Path) -> None:
    require_folder(str(tmp_path))
    with pytest.raises(SourceError, match=r"missing\): the folder does not exist\. Check the path"):
        require_folder(str(tmp_path / "missing"))
    (tmp_path / "one.json").write_text("{}\n")
    with pytest.raises(SourceError, match="this is a file, not a folder"):
        require_folder(str(tmp_path / "one.json"))
