"""Compact binary encoding of a key group's state, and of envelope payloads.

A blob is a 12-byte header (magic and a fingerprint of the schema) followed by one Arrow IPC
record-batch message. The schema itself is not stored: both sides know it, and the
fingerprint turns a changed schema into a clear error instead of garbage.

State blobs are also LZ4-compressed (magic ``ABS2``, with the message's length after the
fingerprint). Spark hands a key group's state between the JVM and Python by pickling it,
byte by byte on the JVM side, every epoch; a third of the bytes is a third of that work.
Uncompressed blobs (``ABS1``, older checkpoints) are still read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa

from pyspark_abs.errors import StateEncodingError

_PLAIN = b"ABS1"
"""An uncompressed blob of an older release: its message starts 12 bytes in, unaligned."""
_ALIGNED = b"ABS3"
"""An uncompressed blob: padded so that its message starts 16 bytes in, 8-byte aligned in a
memory-mapped file and in a Python ``bytes``, as Arrow's kernels want their values."""
_COMPRESSED = b"ABS2"
_MAGIC_BYTES = len(_PLAIN)
_HEADER = _MAGIC_BYTES + 8
_LENGTH = 8
_PAD = bytes(4)
_ALIGNMENT = 8


def schema_fingerprint(schema: pa.Schema) -> bytes:
    """An 8-byte fingerprint of a schema's field names, types and nullability."""
    text = ";".join(f"{f.name}:{f.type}:{f.nullable}" for f in schema)
    return hashlib.blake2b(text.encode(), digest_size=8).digest()


class BatchCodec:
    """Encodes tables of one schema as self-checking blobs."""

    def __init__(self, schema: pa.Schema, what: str, *, compress: bool = False) -> None:
        """Create a codec.

        Args:
            schema: The schema every encoded table has.
            what: What the blobs hold, for error messages (e.g. "state of operator 'wc'").
            compress: LZ4-compress the blobs this codec encodes (it decodes both kinds).
        """
        self.schema = schema
        self._what = what
        self._fingerprint = schema_fingerprint(schema)
        self._compress = compress

    def message(self, table: pa.Table) -> pa.Buffer:
        """The table as one Arrow IPC record-batch message, before framing and compression.

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
        return batch.serialize()

    def frame(self, message: pa.Buffer) -> bytes:
        """A blob holding a message made by :meth:`message`."""
        return b"".join(self.frame_parts(message))

    def frame_parts(
        self, message: pa.Buffer, *, compress: bool | None = None
    ) -> tuple[bytes | pa.Buffer, ...]:
        """The blob of :meth:`frame` in parts, to write without joining them first.

        It is compressed if the codec compresses, unless ``compress`` says otherwise.
        """
        if not (self._compress if compress is None else compress):
            return (_ALIGNED + self._fingerprint + _PAD, message)
        packed = pa.compress(message, codec="lz4", asbytes=True)
        return (_COMPRESSED + self._fingerprint + message.size.to_bytes(_LENGTH, "little"), packed)

    def encode(self, table: pa.Table) -> bytes:
        """Encode a table that has exactly this codec's schema.

        Raises:
            StateEncodingError: The table has another schema.
        """
        return self.frame(self.message(table))

    def decode(self, blob: bytes | pa.Buffer) -> pa.Table:
        """Decode a blob made by :meth:`encode` with the same schema.

        ``blob`` may be an Arrow buffer (a memory-mapped file, say); the table then shares it.

        Raises:
            StateEncodingError: The blob is damaged or was written with another schema.
        """
        view = blob if isinstance(blob, pa.Buffer) else pa.py_buffer(blob)
        header = view[: _HEADER + _LENGTH].to_pybytes()
        magic = header[:_MAGIC_BYTES]
        if magic not in (_ALIGNED, _PLAIN, _COMPRESSED):
            if magic[:3] == _PLAIN[:3] and magic not in (MARKER, _CHAINED):
                raise StateEncodingError(
                    f"cannot decode {self._what}: it was written by a newer release of "
                    f"pyspark-abs (format {magic.decode('ascii', 'replace')}); run the "
                    f"checkpoint with that release or a later one"
                )
            raise StateEncodingError(
                f"cannot decode {self._what}: not a pyspark-abs blob (bad magic bytes)"
            )
        if header[_MAGIC_BYTES:_HEADER] != self._fingerprint:
            raise StateEncodingError(
                f"cannot decode {self._what}: it was written with another schema than "
                f"{self.schema.names}; the declared schema changed since the checkpoint was "
                f"written. Keep the old schema, or start from a new checkpoint"
            )
        try:
            if magic == _ALIGNED:
                message = view[_HEADER + len(_PAD) :]
            elif magic == _PLAIN:
                message = view[_HEADER:]
                if message.address % _ALIGNMENT:
                    message = pa.py_buffer(message.to_pybytes())
            else:
                size = int.from_bytes(header[_HEADER : _HEADER + _LENGTH], "little")
                message = pa.decompress(view[_HEADER + _LENGTH :], size, codec="lz4")
            batch = pa.ipc.read_record_batch(message, self.schema)
        except (pa.ArrowInvalid, OSError) as err:
            raise StateEncodingError(f"cannot decode {self._what}: damaged blob: {err}") from None
        return pa.Table.from_batches([batch], schema=self.schema)


MARKER = b"ABSL"
"""Magic bytes of a live-state marker written before change files (see
:mod:`pyspark_abs.protocol.live_state`)."""
_CHAINED = b"ABSM"
_EPOCH_BYTES = 8
_TOKEN_BYTES = 16
_PLAIN_MARKER = len(MARKER) + _EPOCH_BYTES + _TOKEN_BYTES
_CHAIN_FIELDS = 4
MARKER_BYTES = _PLAIN_MARKER + _CHAIN_FIELDS * _EPOCH_BYTES
"""The length of a marker :func:`encode_marker` writes."""


@dataclass(frozen=True)
class Marker:
    """What Spark's state store keeps for a key group whose state is on local disk.

    Attributes:
        epoch: The epoch that wrote the file.
        token: The random token naming the file.
        base_epoch: The epoch of the whole file the chain of change files starts from
            (``epoch`` itself when the file holds the whole state).
        depth: How many change files the chain holds up to this one.
        chain_bytes: Their bytes.
        base_bytes: The bytes of the whole file (0: unknown).
    """

    epoch: int
    token: bytes
    base_epoch: int
    depth: int = 0
    chain_bytes: int = 0
    base_bytes: int = 0


def encode_marker(marker: Marker) -> bytes:
    """The value Spark's state store keeps for ``marker``."""
    chain = (marker.base_epoch, marker.depth, marker.chain_bytes, marker.base_bytes)
    return (
        _CHAINED
        + marker.epoch.to_bytes(_EPOCH_BYTES, "little", signed=True)
        + marker.token
        + b"".join(n.to_bytes(_EPOCH_BYTES, "little", signed=True) for n in chain)
    )


def decode_marker(stored: bytes) -> Marker | None:
    """The marker ``stored`` holds, or None if it is a state blob."""
    magic = stored[: len(MARKER)]
    if magic not in (MARKER, _CHAINED):
        return None
    size = _PLAIN_MARKER if magic == MARKER else MARKER_BYTES
    if len(stored) != size:
        raise StateEncodingError(
            f"a live-state marker in Spark's state store has {len(stored)} bytes, not "
            f"{size}; the checkpoint is damaged. Roll back to the newest snapshot with "
            f"pyspark_abs.rollback and start again"
        )
    numbers = [
        int.from_bytes(stored[at : at + _EPOCH_BYTES], "little", signed=True)
        for at in range(_PLAIN_MARKER, size, _EPOCH_BYTES)
    ]
    epoch = int.from_bytes(stored[len(MARKER) : len(MARKER) + _EPOCH_BYTES], "little", signed=True)
    token = stored[len(MARKER) + _EPOCH_BYTES : _PLAIN_MARKER]
    if not numbers:  # a marker written before change files: its file holds the whole state
        return Marker(epoch, token, epoch)
    return Marker(epoch, token, *numbers)


SLOT = b"ABSG"
"""Magic bytes of what Spark's state store keeps for a slot serving several key groups."""
_NO_TIMEOUT = -(2**63)


@dataclass(frozen=True)
class SlotEntry:
    """One key group of a slot: its stored value and its earliest timeout.

    Attributes:
        stored: What the key group alone would keep in Spark's state store (a marker).
        timeout_ms: The earliest timeout among its keys (None: no key has one).
    """

    stored: bytes
    timeout_ms: int | None


def encode_slot(entries: dict[int, SlotEntry]) -> bytes:
    """The value Spark's state store keeps for a slot's key groups, by key group."""
    parts = [SLOT, len(entries).to_bytes(4, "little")]
    for key_group in sorted(entries):
        entry = entries[key_group]
        timeout = _NO_TIMEOUT if entry.timeout_ms is None else entry.timeout_ms
        parts += [
            key_group.to_bytes(4, "little", signed=True),
            timeout.to_bytes(8, "little", signed=True),
            len(entry.stored).to_bytes(4, "little"),
            entry.stored,
        ]
    return b"".join(parts)


def decode_slot(stored: bytes) -> dict[int, SlotEntry]:
    """The key groups :func:`encode_slot` wrote into ``stored``.

    Raises:
        StateEncodingError: ``stored`` is not a slot's value, or is cut short.
    """
    view = memoryview(stored)
    if bytes(view[: len(SLOT)]) != SLOT:
        raise StateEncodingError(
            f"Spark's state store holds a value with magic bytes {bytes(view[: len(SLOT)])!r} "
            f"where a slot of key groups was expected; the checkpoint was written with "
            f"another layout or is damaged. Roll back to the newest snapshot with "
            f"pyspark_abs.rollback and start again"
        )
    entries: dict[int, SlotEntry] = {}
    count = int.from_bytes(view[4:8], "little") if len(view) >= 8 else -1
    at = 8
    while len(entries) < count and at + 16 <= len(view):
        key_group = int.from_bytes(view[at : at + 4], "little", signed=True)
        timeout = int.from_bytes(view[at + 4 : at + 12], "little", signed=True)
        end = at + 16 + int.from_bytes(view[at + 12 : at + 16], "little")
        if end > len(view):
            break
        entries[key_group] = SlotEntry(
            bytes(view[at + 16 : end]), None if timeout == _NO_TIMEOUT else timeout
        )
        at = end
    if len(entries) != count or at != len(view):
        raise StateEncodingError(
            f"a slot of key groups in Spark's state store is cut short ({len(view)} bytes, "
            f"{count} key groups declared); the checkpoint is damaged. Roll back to the "
            f"newest snapshot with pyspark_abs.rollback and start again"
        )
    return entries
