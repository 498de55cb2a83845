"""Compact binary encoding of a key group's state, and of envelope payloads.

A blob is a 12-byte header (magic and a fingerprint of the schema) followed by one Arrow IPC
record-batch message. The schema itself is not stored: both sides know it, and the
fingerprint turns a changed schema into a clear error instead of garbage.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa

from pyspark_abs.errors import StateEncodingError

_MAGIC = b"ABS1"
_HEADER = len(_MAGIC) + 8


def schema_fingerprint(schema: pa.Schema) -> bytes:
    """An 8-byte fingerprint of a schema's field names, types and nullability."""
    text = ";".join(f"{f.name}:{f.type}:{f.nullable}" for f in schema)
    return hashlib.blake2b(text.encode(), digest_size=8).digest()


class BatchCodec:
    """Encodes tables of one schema as self-checking blobs."""

    def __init__(self, schema: pa.Schema, what: str) -> None:
        """Create a codec.

        Args:
            schema: The schema every encoded table has.
            what: What the blobs hold, for error messages (e.g. "state of operator 'wc'").
        """
        self.schema = schema
        self._what = what
        self._header = _MAGIC + schema_fingerprint(schema)

    def encode(self, table: pa.Table) -> bytes:
        """Encode a table that has exactly this codec's schema.

        Raises:
            StateEncodingError: The table has another schema.
        """
        if not table.schema.equals(self.schema):
            raise StateEncodingError(
                f"cannot encode {self._what}: table schema {table.schema} differs from "
                f"{self.schema}"
            )
        batches = table.combine_chunks().to_batches()
        batch = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=self.schema)
        return self._header + batch.serialize().to_pybytes()

    def decode(self, blob: bytes) -> pa.Table:
        """Decode a blob made by :meth:`encode` with the same schema.

        Raises:
            StateEncodingError: The blob is damaged or was written with another schema.
        """
        if blob[: len(_MAGIC)] != _MAGIC:
            raise StateEncodingError(
                f"cannot decode {self._what}: not a pyspark-abs blob (bad magic bytes)"
            )
        if blob[len(_MAGIC) : _HEADER] != self._header[len(_MAGIC) :]:
            raise StateEncodingError(
                f"cannot decode {self._what}: it was written with another schema than "
                f"{self.schema.names}; the declared schema changed since the checkpoint was "
                f"written. Keep the old schema, or start from a new checkpoint"
            )
        try:
            batch = pa.ipc.read_record_batch(pa.py_buffer(blob)[_HEADER:], self.schema)
        except (pa.ArrowInvalid, OSError) as err:
            raise StateEncodingError(f"cannot decode {self._what}: damaged blob: {err}") from None
        return pa.Table.from_batches([batch], schema=self.schema)
