"""A key group's live-state file as a whole file followed by a chain of change files.

A steady epoch changes a few keys of a key group, but its whole state is what the next
epoch reads. Rewriting the whole file for every changed key group makes the local bytes
written per epoch follow the size of the state. Instead, a save writes only what the epoch
changed, in a file that names the file it applies to, while the chain of change files stays
small against the whole file it starts from: at most a share of its bytes (the
``local_state_change_share`` setting) and ``MAX_DEPTH`` files. Then the next save writes the
whole state again. Every change is thus written once in a change file and, amortized, at
most about 1/share times as part of a whole file, whatever the size of the state.

Reading a chain hashes no key. The rows of the whole file and of the chain's change files,
in chain order, are numbered; a change file holds its new rows (LZ4-compressed) and the
numbers of the earlier rows it replaces or removes. A read concatenates the rows and drops
the replaced ones, which is one pass over the state. The operator says which rows of the
state it read it kept (see :class:`~pyspark_abs.operators.state_diff.KeyGroupOutcome`),
which the numbers of the rows read turn into the numbers a change file holds.

A change file is ``ABSD``, the marker of the file it applies to and that file's identity
(inode and modification time, as read), the number of rows of the chain it extends and of
rows it replaces (8 bytes each), those rows' numbers (4 bytes each), then its new rows as a
blob of the state codec. A whole file is a blob of the state codec. A file the chain applies
to that was rebuilt since (its rows in another order) has another identity, so a chain never
applies row numbers to rows they do not name.
"""

from __future__ import annotations

import mmap
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from pyspark_abs.errors import StateEncodingError
from pyspark_abs.operators.keys import BoolArray, IntArray
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.state_codec import MARKER_BYTES, Marker, decode_marker, encode_marker

MAX_DEPTH = 40
"""A chain holds at most this many change files."""
_STAGGER = 8
IDENTITY_BYTES = 16
"""The length of a file's identity."""
_CHANGE_FILE = b"ABSD"
_COUNT = 8
_ROW_NUMBER = np.dtype("<u4")


@dataclass(frozen=True)
class ChainRows:
    """Where the rows of a state read from a chain sit among the chain's rows.

    Attributes:
        rows: The chain row number of each row of the state (None: row i is row i).
        chain_rows: How many rows the chain holds, replaced ones included.
        identity: The identity of the file the marker names, as read.
    """

    rows: IntArray | None
    chain_rows: int
    identity: bytes

    @property
    def state_rows(self) -> int:
        """How many rows the state read holds."""
        return self.chain_rows if self.rows is None else len(self.rows)


def extends_chain(replaced: Marker | None, change_bytes: int, key_group: int, share: float) -> bool:
    """Whether a change file of ``change_bytes`` goes on the chain ``replaced`` ends.

    The chain's change files may hold ``share`` of the bytes of its whole file (0: no
    chain). Key groups end chains a little apart (in depth and bytes), so that key groups
    changed alike (all of them, on uniform keys) do not all write their whole state in one
    epoch.
    """
    offset = key_group % _STAGGER
    allowed = replaced.base_bytes * share * (1 - offset / (4 * _STAGGER)) if replaced else 0
    return (
        replaced is not None
        and replaced.depth < MAX_DEPTH - offset
        and replaced.chain_bytes + change_bytes <= allowed
    )


def change_file(
    plan: OperatorPlan, replaced: Marker, read: ChainRows, kept: BoolArray, state: pa.Table
) -> tuple[bytes | pa.Buffer, ...]:
    """The parts of the change file from the state ``replaced`` names to ``state``.

    ``kept`` says which rows of the state read (see ``read``) ``state`` begins with, in
    their order; its other rows are new.
    """
    dropped = np.flatnonzero(~kept) if read.rows is None else read.rows[~kept]
    numbers = dropped.astype(_ROW_NUMBER)
    added = state.slice(int(np.count_nonzero(kept)))
    frame = plan.state_codec.frame_parts(plan.state_codec.message(added), compress=True)
    counts = read.chain_rows.to_bytes(_COUNT, "little") + len(numbers).to_bytes(_COUNT, "little")
    header = _CHANGE_FILE + encode_marker(replaced) + read.identity + counts
    return (header, numbers.tobytes(), *frame)


def read_chain(
    plan: OperatorPlan, marker: Marker, path_of: Callable[[Marker], str]
) -> tuple[pa.Table, ChainRows]:
    """The state ``marker`` names, and where its rows sit in the chain.

    ``path_of(m)`` is the path of the file marker ``m`` names. Change files are immutable
    under their names, so this worker keeps the ones it parsed (up to
    :data:`CACHED_CHANGE_BYTES`) by path and identity, and a chain read again the next
    epoch parses only its newest change file.

    Raises:
        OSError: A file of the chain is gone.
        StateEncodingError: A file of the chain is damaged, or no longer fits the file it
            applies to (that one was rebuilt since).
    """
    links: list[_Link] = []
    at, expected, top = marker, None, b""
    for _ in range(MAX_DEPTH + 1):
        path = path_of(at)
        link = _LINKS.fresh(path, plan.blob_schema)
        if link is None:
            data, identity = map_file(path)
            if data[: len(_CHANGE_FILE)].to_pybytes() == _CHANGE_FILE:
                link = _link(plan, at, data, identity)
                _LINKS.add(path, link)
        else:
            identity = link.identity
        _check_identity(plan, at, identity, expected)
        top = top or identity
        if link is None:
            base = plan.state_codec.decode(data)
            break
        at, expected = link.parent, link.parent_identity
        links.append(link)
    else:
        raise StateEncodingError(
            f"operator {plan.name!r}: the chain of change files ending at epoch "
            f"{marker.epoch} is longer than {MAX_DEPTH}; it is damaged"
        )
    if not links:
        return base, ChainRows(None, base.num_rows, top)
    total, added = base.num_rows, []
    drops = []
    for *_, extends, dropped, new_rows in reversed(links):
        if extends != total or (len(dropped) and int(dropped.max()) >= total):
            raise StateEncodingError(
                f"operator {plan.name!r}: a change file of the chain ending at epoch "
                f"{marker.epoch} does not fit the file it applies to"
            )
        drops.append(dropped)
        added.append(new_rows)
        total += new_rows.num_rows
    keep = np.ones(total, dtype=bool)
    keep[np.concatenate(drops)] = False
    parts = [
        _filter(base, keep[: base.num_rows]),
        _filter(pa.concat_tables(added), keep[base.num_rows :]),
    ]
    return pa.concat_tables(parts), ChainRows(np.flatnonzero(keep), total, top)


def _filter(table: pa.Table, mask: BoolArray) -> pa.Table:
    """``table.filter(mask)``; a column of nulls only is made anew instead of filtered.

    A mask drops few rows here: filtering copies the runs between them, about twice as
    fast as gathering the rows by number.
    """
    count = int(np.count_nonzero(mask))
    if count == table.num_rows:
        return table
    selection = pa.array(mask)
    columns = [
        pa.nulls(count, column.type)
        if column.null_count == len(column)
        else column.filter(selection)
        for column in table.columns
    ]
    return pa.Table.from_arrays(columns, schema=table.schema)


def map_file(path: str) -> tuple[pa.Buffer, bytes]:
    """A file's bytes, memory-mapped, and its identity (inode and modification time).

    Raises:
        OSError: The file is gone or empty.
    """
    handle = os.open(path, os.O_RDONLY)
    try:
        info = os.fstat(handle)
        if not info.st_size:
            raise OSError(f"{path} is empty")
        data = pa.py_buffer(mmap.mmap(handle, 0, access=mmap.ACCESS_READ))
    finally:
        os.close(handle)
    return data, _identity(info)


def file_identity(path: str) -> bytes:
    """The identity of the file at ``path`` (see :func:`map_file`).

    Raises:
        OSError: The file is gone.
    """
    return _identity(os.stat(path))


def _identity(info: os.stat_result) -> bytes:
    return info.st_ino.to_bytes(8, "little") + info.st_mtime_ns.to_bytes(8, "little")


def _check_identity(
    plan: OperatorPlan, at: Marker, identity: bytes, expected: bytes | None
) -> None:
    """Refuse a file that is not the one the change file after it applies to."""
    if expected is not None and identity != expected:
        raise StateEncodingError(
            f"operator {plan.name!r}: the file of epoch {at.epoch} was written again "
            f"since the change files after it"
        )


class _Link(NamedTuple):
    """A parsed change file."""

    identity: bytes
    """Its own identity, as parsed."""
    parent: Marker
    """The marker of the file it applies to."""
    parent_identity: bytes
    extends: int
    """How many rows the chain it extends holds."""
    dropped: IntArray
    """The chain row numbers of the rows it replaces or removes."""
    new_rows: pa.Table


class _ParsedLinks:
    """Change files this worker parsed, by path, up to ``limit`` bytes.

    When full, one at random is forgotten. A worker reads its chains in the same cyclic
    order every epoch, and a working set larger than ``limit`` would make oldest-first
    forget each file just before it is read again: no read would find one.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.links: dict[str, _Link] = {}
        self._victims = random.Random(0)

    def fresh(self, path: str, schema: pa.Schema) -> _Link | None:
        """The change file parsed from ``path``, while the file on disk is the one parsed.

        None if this worker holds no such file, or its rows do not have ``schema``.

        Raises:
            OSError: The file is gone.
        """
        link = self.links.get(path)
        if link is None or not link.new_rows.schema.equals(schema):
            return None
        return link if file_identity(path) == link.identity else None

    def add(self, path: str, link: _Link) -> None:
        self.held -= _size(self.links.pop(path)) if path in self.links else 0
        size = _size(link)
        if size > self.limit:
            return
        while self.held + size > self.limit:
            victim = self._victims.choice(tuple(self.links))
            self.held -= _size(self.links.pop(victim))
        self.links[path] = link
        self.held += size


def _size(link: _Link) -> int:
    return int(link.new_rows.get_total_buffer_size() + link.dropped.nbytes)


CACHED_CHANGE_BYTES = 64 << 20
"""How many bytes of parsed change files a worker keeps at most."""
_LINKS = _ParsedLinks(CACHED_CHANGE_BYTES)


def _link(plan: OperatorPlan, at: Marker, data: pa.Buffer, own: bytes) -> _Link:
    """Parse the change file ``at`` names, whose identity is ``own``."""
    start = len(_CHANGE_FILE)
    parent = decode_marker(data[start : start + MARKER_BYTES].to_pybytes())
    if parent is None or parent.epoch >= at.epoch:
        raise StateEncodingError(
            f"operator {plan.name!r}: the change file of epoch {at.epoch} names no earlier "
            f"file; it is damaged"
        )
    start += MARKER_BYTES
    identity = data[start : start + IDENTITY_BYTES].to_pybytes()
    start += IDENTITY_BYTES
    extends = int.from_bytes(data[start : start + _COUNT].to_pybytes(), "little")
    count = int.from_bytes(data[start + _COUNT : start + 2 * _COUNT].to_pybytes(), "little")
    start += 2 * _COUNT
    end = start + count * _ROW_NUMBER.itemsize
    dropped = np.frombuffer(memoryview(data[start:end]), dtype=_ROW_NUMBER).astype(np.int64)
    if len(dropped) != count:
        raise StateEncodingError(
            f"operator {plan.name!r}: the change file of epoch {at.epoch} is torn"
        )
    return _Link(own, parent, identity, extends, dropped, plan.state_codec.decode(data[end:]))
