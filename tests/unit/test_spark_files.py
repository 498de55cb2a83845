"""Spark's file source: its offsets, its metadata log and its declaration, without Spark."""

import json

import pytest

from pyspark_abs import SparkFileSource
from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.sources.files.spark import files_through, path_forms


def log_file(*entries: tuple[str, int]) -> str:
    """A file of Spark's file source log: the version line, then one JSON entry per file."""
    lines = [json.dumps({"path": p, "timestamp": 1, "batchId": b}) for p, b in entries]
    return "\n".join(["v1", *lines])


def test_files_through_a_batch_reads_the_newest_compaction_and_the_batches_after_it() -> None:
    log = {
        "0": log_file(("file:///in/a", 0)),
        "1.compact": log_file(("file:///in/a", 0), ("file:///in/b", 1)),
        "2": log_file(("file:///in/c", 2), ("file:///in/d", 2)),
        "3.compact": log_file(
            ("file:///in/a", 0),
            ("file:///in/b", 1),
            ("file:///in/c", 2),
            ("file:///in/d", 2),
            ("file:///in/e", 3),
        ),
        "4": log_file(("file:///in/f", 4)),
    }
    assert files_through(log, 2) == [f"file:///in/{n}" for n in "abcd"]
    assert files_through(log, 4) == [f"file:///in/{n}" for n in "abcdef"]
    assert files_through({"0": log["0"], "2": log["2"]}, 2) == [f"file:///in/{n}" for n in "acd"]


def test_a_log_that_does_not_reach_the_batch_or_is_not_a_log_is_an_error() -> None:
    with pytest.raises(SourceError, match=r"log has no batch 5 \(it holds \['0', '1'\]\)"):
        files_through({"0": log_file(("a", 0)), "1": log_file(("b", 1))}, 5)
    with pytest.raises(SourceError, match="0 is not a file of Spark's file source log"):
        files_through({"0": "v9\n{}"}, 0)


def test_paths_match_whatever_scheme_form_and_encoding_spark_gives_them() -> None:
    forms = path_forms(["file:///in/c%20d.json", "s3a://bucket/in/x.json", "/plain/p"])
    assert {"/in/c%20d.json", "/in/c d.json", "/in/x.json", "/plain/p"} == forms
    assert path_forms(["file:/in/c%20d.json"]) & forms == {"/in/c%20d.json", "/in/c d.json"}


def test_only_a_log_offset_is_an_offset_of_spark_file_source() -> None:
    assert SparkFileSource.log_offset_of('{"logOffset": 7}') == 7
    for other in ('{"logOffset": 7, "x": 1}', '{"logOffset": "7"}', "7", "not json"):
        with pytest.raises(ConfigError, match="not an offset of Spark's file source"):
            SparkFileSource.log_offset_of(other)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"path": "", "format": "json", "schema": "a int"}, "path must be a non-empty string"),
        ({"path": "/in", "format": "", "schema": "a int"}, "format must be a non-empty string"),
        ({"path": "/in", "format": "json"}, "a streaming json source needs a schema"),
        (
            {"path": "/in", "format": "text", "options": {"maxFilesPerTrigger": 1}},
            "options must be a dict of text to text",
        ),
        (
            {"path": "/in", "format": "text", "options": {"cleanSource": "archive"}},
            r"cleanSource='archive' archives or deletes files once read, but a rollback",
        ),
    ],
)
def test_a_bad_declaration_says_what_is_wrong(given: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SparkFileSource(**given)  # type: ignore[arg-type]


def test_text_needs_no_schema_and_cleansource_off_is_accepted() -> None:
    assert SparkFileSource("/in", "text", options={"CLEANSOURCE": "OFF"}).schema is None
