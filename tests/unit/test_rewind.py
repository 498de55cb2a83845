"""Which recorded source offsets a restore can rewind to."""

import json
from typing import Any

import pytest

from pyspark_abs.errors import ConfigError, SourceError
from pyspark_abs.manifest.entries import EpochStatus
from pyspark_abs.protocol.epoch_writer import now
from pyspark_abs.sources.delta.spark import DeltaPosition, SparkDeltaSource
from pyspark_abs.sources.rewind import require_rewindable, unrewindable
from pyspark_abs.storage.root import SnapshotRoot
from tests.support.manifest import entry

DELTA = json.dumps({"source": "pyspark_abs_delta", "version": 3, "index": 0})
LOOP = json.dumps({"source": "pyspark_abs_delta", "version": 1, "index": 2, "tag": "edge"})
KAFKA = json.dumps({"clicks": {"0": 12, "1": 7}})
FILES = json.dumps({"logOffset": 4})


def test_delta_loop_heads_kafka_and_spark_files_rewind_others_do_not() -> None:
    assert unrewindable(None) == []
    assert unrewindable("\n".join([DELTA, LOOP, KAFKA, FILES])) == []
    assert [line for line, _ in unrewindable("\n".join([DELTA, FILES, "17", KAFKA]))] == ["17"]


def spark_delta(version: int, index: int, starting: bool = False) -> str:
    """An offset as Spark's Delta source records it."""
    return json.dumps(
        {
            "sourceVersion": 1,
            "reservoirId": "5e1f",
            "reservoirVersion": version,
            "index": index,
            "isStartingVersion": starting,
        }
    )


def test_spark_delta_offsets_rewind_on_a_version_boundary_only() -> None:
    assert SparkDeltaSource.position_of(spark_delta(7, -1)) == DeltaPosition("5e1f", 7)
    assert unrewindable(spark_delta(7, -1)) == []
    for inside in (spark_delta(7, 0), spark_delta(2, 4, starting=True), spark_delta(2, -1, True)):
        [(line, why)] = unrewindable(inside)
        assert line == inside
        assert "no option starts a Delta stream inside a version" in why
    with pytest.raises(SourceError, match=r"inside version 7 of table 5e1f \(file 3 of it; a"):
        SparkDeltaSource.position_of(spark_delta(7, 3))
    with pytest.raises(ConfigError, match="not an offset of Spark's Delta source"):
        SparkDeltaSource.position_of(FILES)


def test_the_refusal_names_the_epoch_the_offset_and_what_to_do() -> None:
    snapshot = entry(
        5,
        EpochStatus.COMMITTED,
        pipeline="words",
        recorded_at=now(),
        run_id="run",
        source_offsets=f"17\n{LOOP}",
    )
    with pytest.raises(
        SourceError,
        match=r"cannot roll back to epoch 5: no run can continue after epoch 5 of /r \(its "
        r"recorded offset is 17: a socket, a rate source.*Nothing was changed.*land "
        r"the input in a bronze Delta table",
    ):
        require_rewindable(snapshot, SnapshotRoot("/r"), "roll back to epoch 5")
    plain = entry(5, EpochStatus.COMMITTED, pipeline="words", recorded_at=now(), run_id="run")
    require_rewindable(plain, SnapshotRoot("/r"), "x")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({}, "exactly one of path= and table=, got path=None table=None"),
        ({"path": "/t", "table": "t"}, "exactly one of path= and table="),
        ({"path": "/t", "options": {"maxFilesPerTrigger": 5}}, r"SparkDeltaSource\(/t\): options"),
    ],
)
def test_a_spark_delta_source_needs_one_table_and_text_options(
    given: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        SparkDeltaSource(**given)
