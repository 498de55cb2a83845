import pyarrow as pa
import pytest

from pyspark_abs.errors import StateEncodingError
from pyspark_abs.operators.state_codec import BatchCodec
from tests.support.inputs import arrow_schema

SCHEMA = arrow_schema(("k", pa.string()), ("n", pa.int64()), ("tags", pa.list_(pa.string())))


def test_round_trip_keeps_values_and_types() -> None:
    codec = BatchCodec(SCHEMA, "state of 'wc'")
    table = pa.table({"k": ["a", None], "n": [1, 2], "tags": [["x"], []]}, schema=SCHEMA)
    assert codec.decode(codec.encode(table)).equals(table)


@pytest.mark.parametrize("compress", [False, True])
def test_decoded_columns_are_aligned_for_arrow_kernels(compress: bool) -> None:
    """A plain blob's message starts 12 bytes in; Acero warns on (and some hardware faults
    at) 8-byte values that are not 8-byte aligned."""
    codec = BatchCodec(SCHEMA, "state", compress=compress)
    table = pa.table({"k": ["a", None], "n": [1, 2], "tags": [["x"], []]}, schema=SCHEMA)
    blob = codec.encode(table)
    older = b"ABS1" + blob[4:12] + blob[16:]  # an older release's blob: no padding
    sources: list[bytes | pa.Buffer] = [blob, pa.py_buffer(blob), *([] if compress else [older])]
    for source in sources:
        decoded = codec.decode(source)
        buffers = [b for c in decoded.columns for b in c.chunks[0].buffers() if b is not None]
        assert [b.address % 8 for b in buffers] == [0] * len(buffers)
        assert decoded.equals(table)


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


def test_compressed_blobs_round_trip_and_are_smaller() -> None:
    schema = arrow_schema(("key", pa.int64()), ("count", pa.int64()))
    table = pa.table(
        {"key": list(range(2000)), "count": [i % 7 for i in range(2000)]}, schema=schema
    )
    plain = BatchCodec(schema, "state").encode(table)
    compressed = BatchCodec(schema, "state", compress=True).encode(table)
    assert len(compressed) < len(plain) / 2
    assert BatchCodec(schema, "state", compress=True).decode(compressed).equals(table)
    # Either codec reads both kinds: checkpoints written before compression still load.
    assert BatchCodec(schema, "state").decode(compressed).equals(table)
    assert BatchCodec(schema, "state", compress=True).decode(plain).equals(table)


def test_the_message_is_the_uncompressed_arrow_size() -> None:
    codec = BatchCodec(SCHEMA, "state", compress=True)
    table = pa.table(
        {"k": ["a"] * 100, "n": list(range(100)), "tags": [["x"]] * 100}, schema=SCHEMA
    )
    message = codec.message(table)
    assert message.size > len(codec.frame(message))
    assert codec.decode(codec.frame(message)).equals(table)


def test_damaged_compressed_blobs_are_refused() -> None:
    codec = BatchCodec(SCHEMA, "state", compress=True)
    blob = codec.encode(
        pa.table({"k": ["a"] * 50, "n": [1] * 50, "tags": [["x"]] * 50}, schema=SCHEMA)
    )
    with pytest.raises(StateEncodingError, match="damaged"):
        codec.decode(blob[:-5])


def test_a_blob_of_a_newer_format_says_so() -> None:
    codec = BatchCodec(SCHEMA, "state of 'wc'")
    blob = codec.encode(SCHEMA.empty_table())
    with pytest.raises(StateEncodingError, match=r"written by a newer release .*format ABS9"):
        codec.decode(b"ABS9" + blob[4:])
    with pytest.raises(StateEncodingError, match="not a pyspark-abs blob"):
        codec.decode(b"XYZ1" + blob[4:])
