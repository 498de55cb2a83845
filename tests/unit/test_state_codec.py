import pyarrow as pa
import pytest

from pyspark_abs.errors import StateEncodingError
from pyspark_abs.state_codec import BatchCodec
from tests.conftest import arrow_schema

SCHEMA = arrow_schema(("k", pa.string()), ("n", pa.int64()), ("tags", pa.list_(pa.string())))


def test_round_trip_keeps_values_and_types() -> None:
    codec = BatchCodec(SCHEMA, "state of 'wc'")
    table = pa.table({"k": ["a", None], "n": [1, 2], "tags": [["x"], []]}, schema=SCHEMA)
    assert codec.decode(codec.encode(table)).equals(table)


def test_round_trip_of_empty_and_chunked_tables() -> None:
    codec = BatchCodec(SCHEMA, "state")
    assert codec.decode(codec.encode(SCHEMA.empty_table())).num_rows == 0
    part = pa.table({"k": ["a"], "n": [1], "tags": [["x"]]}, schema=SCHEMA)
    chunked = pa.concat_tables([part, part])
    assert codec.decode(codec.encode(chunked)).to_pylist() == chunked.to_pylist()


def test_blob_of_another_schema_is_refused() -> None:
    blob = BatchCodec(SCHEMA, "old").encode(SCHEMA.empty_table())
    changed = arrow_schema(
        ("k", pa.string()),
        ("n", pa.int32()),
        ("tags", pa.list_(pa.string())),
    )
    with pytest.raises(StateEncodingError, match="another schema"):
        BatchCodec(changed, "state of 'wc'").decode(blob)


def test_damaged_blobs_are_refused() -> None:
    codec = BatchCodec(SCHEMA, "state")
    with pytest.raises(StateEncodingError, match="bad magic"):
        codec.decode(b"nonsense")
    blob = codec.encode(pa.table({"k": ["a"], "n": [1], "tags": [["x"]]}, schema=SCHEMA))
    with pytest.raises(StateEncodingError, match="damaged"):
        codec.decode(blob[:20])


def test_encode_checks_the_schema() -> None:
    with pytest.raises(StateEncodingError, match="differs"):
        BatchCodec(SCHEMA, "state").encode(pa.table({"k": ["a"]}))
