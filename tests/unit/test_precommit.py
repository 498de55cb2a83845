"""Pre-commit writes real Parquet files to a local directory; no Spark needed."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pyspark_abs.protocol.precommit as precommit
from pyspark_abs.operators.envelope import Kind, envelope_frame
from pyspark_abs.operators.state_codec import BatchCodec
from pyspark_abs.protocol.precommit import PrecommitPlan, TableTarget, write_partition
from tests.support.inputs import arrow_schema

CHANGES = arrow_schema(
    ("k", pa.string()),
    ("n", pa.int64()),
    ("_timeout", pa.int64()),
    ("_deleted", pa.bool_()),
)
STATE_TABLE = arrow_schema(
    ("k", pa.string()),
    ("n", pa.int64()),
    ("_key_group", pa.int32()),
    ("_epoch", pa.int64()),
    ("_deleted", pa.bool_()),
    ("_timeout", pa.int64()),
)
OUT = arrow_schema(("day", pa.string()), ("k", pa.string()), ("n", pa.int64()))


def envelope(key_group: int, changes: pa.Table, output: pa.Table) -> pa.RecordBatch:
    frame = envelope_frame(
        key_group,
        (changes, BatchCodec(CHANGES, "c").encode(changes)),
        keys_delta=changes.num_rows,
        outputs=[(0, output, BatchCodec(OUT, "o").encode(output))],
    )
    return pa.RecordBatch.from_pandas(frame, preserve_index=False)


def test_partition_files_and_marker(tmp_path: Path) -> None:
    plan = PrecommitPlan(
        operator="wc",
        epoch=5,
        targets=(
            TableTarget("state/wc", str(tmp_path / "state"), Kind.STATE, 0, CHANGES, STATE_TABLE),
            TableTarget("sink/out", str(tmp_path / "sink"), Kind.OUTPUT, 0, OUT, OUT, ("day",)),
        ),
        target_file_bytes=1 << 20,
    )
    changes = pa.table(
        {"k": ["a", "b"], "n": [1, 2], "_timeout": [None, None], "_deleted": [False, False]},
        schema=CHANGES,
    )
    output = pa.table(
        {"day": ["mon", "tue/x", None], "k": ["a", "b", "c"], "n": [1, 2, 3]}, schema=OUT
    )
    marker = write_partition(
        plan,
        iter([envelope(3, changes, output), envelope(4, changes.slice(0, 1), output.slice(0, 1))]),
        2,
        1,
    )

    assert (marker.operator, marker.epoch, marker.partition, marker.attempt) == ("wc", 5, 2, 1)
    assert marker.keys_delta == 3
    state_files = [f for f in marker.files if f.table == "state/wc"]
    assert len(state_files) == 1
    written = pq.read_table(tmp_path / "state" / state_files[0].path)
    assert written.schema.names == STATE_TABLE.names
    assert sorted(written.to_pylist(), key=lambda r: (r["k"], r["_key_group"])) == [
        {"k": "a", "n": 1, "_key_group": 3, "_epoch": 5, "_deleted": False, "_timeout": None},
        {"k": "a", "n": 1, "_key_group": 4, "_epoch": 5, "_deleted": False, "_timeout": None},
        {"k": "b", "n": 2, "_key_group": 3, "_epoch": 5, "_deleted": False, "_timeout": None},
    ]
    assert state_files[0].size_bytes == (tmp_path / "state" / state_files[0].path).stat().st_size
    stats = json.loads(state_files[0].stats)
    assert stats["numRecords"] == 3
    assert stats["minValues"]["k"] == "a"
    assert stats["maxValues"]["_epoch"] == 5
    assert stats["nullCount"]["_timeout"] == 3

    sink_files = {f.path.split("/")[0]: f for f in marker.files if f.table == "sink/out"}
    assert set(sink_files) == {"day=mon", "day=tue%2Fx", "day=__HIVE_DEFAULT_PARTITION__"}
    assert json.loads(sink_files["day=tue%2Fx"].partition_values) == {"day": "tue/x"}
    assert json.loads(sink_files["day=__HIVE_DEFAULT_PARTITION__"].partition_values) == {
        "day": None
    }
    mon = pq.read_table(tmp_path / "sink" / sink_files["day=mon"].path)
    assert mon.schema.names == ["k", "n"]
    assert mon.num_rows == 2


def test_empty_partition_yields_a_marker_without_files(tmp_path: Path) -> None:
    plan = PrecommitPlan("wc", 0, (), 1 << 20)
    marker = write_partition(plan, iter([]), 0, 0)
    assert marker.files == ()
    assert marker.keys_delta == 0


def test_files_roll_over_at_the_target_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(precommit, "_FLUSH_ROWS", 1)
    target = TableTarget("sink/out", str(tmp_path), Kind.OUTPUT, 0, OUT, OUT)
    plan = PrecommitPlan("wc", 1, (target,), target_file_bytes=1)
    output = pa.table({"day": ["d"] * 10, "k": ["x"] * 10, "n": list(range(10))}, schema=OUT)
    frame = envelope_frame(0, None, 0, [(0, output, BatchCodec(OUT, "o").encode(output))])
    batch = pa.RecordBatch.from_pandas(frame, preserve_index=False)
    marker = write_partition(plan, iter([batch, batch, batch]), 0, 0)
    assert len(marker.files) == 3
    assert sum(f.num_rows for f in marker.files) == 30


def test_statistics_follow_fields_past_nested_columns(tmp_path: Path) -> None:
    schema = arrow_schema(
        ("k", pa.string()),
        ("items", pa.list_(pa.string())),
        ("last", pa.struct([("item", pa.string()), ("n", pa.int32())])),
        ("n", pa.int64()),
        ("flag", pa.bool_()),
    )
    table = pa.table(
        {
            "k": ["a", "b"],
            "items": [["x", "y"], []],
            "last": [{"item": "y", "n": 2}, None],
            "n": [5, None],
            "flag": [False, False],
        },
        schema=schema,
    )
    target = TableTarget("sink/out", str(tmp_path), Kind.OUTPUT, 0, schema, schema)
    frame = envelope_frame(0, None, 0, [(0, table, BatchCodec(schema, "o").encode(table))])
    batch = pa.RecordBatch.from_pandas(frame, preserve_index=False)
    [written] = write_partition(
        PrecommitPlan("op", 0, (target,), 1 << 20), iter([batch]), 0, 0
    ).files
    stats = json.loads(written.stats)
    assert stats["minValues"] == {"k": "a", "n": 5}
    assert stats["maxValues"] == {"k": "b", "n": 5}
    assert stats["nullCount"] == {"k": 0, "n": 1, "flag": 0}
