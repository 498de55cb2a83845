"""The arithmetic of the window operators on flat NumPy arrays, read from and written to Arrow.

A key group's windows are parallel arrays: each window's key (an integer id), the row that
holds its key's columns, its start and end in ms, and per aggregate its values and which of
them are not null. Merging sorts them once by key and start and reduces each run of windows
that are one window (tumbling: the same start; sessions: overlapping) with ``reduceat``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_abs.operators.keys import joint_codes

Array = np.ndarray[Any, Any]

_REDUCE = {"count": np.add, "sum": np.add, "min": np.minimum, "max": np.maximum}


@dataclass(frozen=True)
class Windows:
    """Windows as parallel arrays.

    Attributes:
        ids: Each window's key, as an integer equal for equal keys.
        at: The row of a frame of key columns that holds each window's key.
        start: Start in ms since the Unix epoch.
        end: End in ms since the Unix epoch (exclusive).
        values: Per aggregate, its values (int64 or float64; anything where not valid).
        valid: Per aggregate, which values are not null.
    """

    ids: Array
    at: Array
    start: Array
    end: Array
    values: tuple[Array, ...]
    valid: tuple[Array, ...]

    def __len__(self) -> int:
        return len(self.ids)

    def take(self, which: Array) -> Windows:
        """The windows at ``which`` (positions or a boolean mask), in that order."""
        return Windows(
            self.ids[which],
            self.at[which],
            self.start[which],
            self.end[which],
            tuple(v[which] for v in self.values),
            tuple(v[which] for v in self.valid),
        )

    def then(self, other: Windows) -> Windows:
        """These windows followed by ``other``'s."""
        return Windows(
            np.concatenate([self.ids, other.ids]),
            np.concatenate([self.at, other.at]),
            np.concatenate([self.start, other.start]),
            np.concatenate([self.end, other.end]),
            tuple(np.concatenate(p) for p in zip(self.values, other.values, strict=True)),
            tuple(np.concatenate(p) for p in zip(self.valid, other.valid, strict=True)),
        )

    def key_starts(self) -> Array:
        """Where each key's run begins, for windows ordered by key."""
        if not len(self):
            return np.empty(0, dtype=np.int64)
        return np.flatnonzero(np.r_[True, self.ids[1:] != self.ids[:-1]])


def merge(windows: Windows, functions: Sequence[str], *, session: bool) -> Windows:
    """Windows that are one window as one, ordered by key and start.

    Tumbling windows of a key with the same start are one; a key's sessions are one while
    each starts before the furthest end of those before it (a session that starts at that
    end is a new one). ``functions`` are the aggregates' (count, sum, min or max): counts
    add up and ignore nulls; a sum, min or max of only nulls is null.
    """
    if not len(windows):
        return windows
    ordered = windows.take(np.lexsort((windows.start, windows.ids)))
    first = np.zeros(len(ordered), dtype=bool)
    first[ordered.key_starts()] = True
    if session:
        run = np.cumsum(first)
        reach = pd.Series(ordered.end).groupby(run, sort=False).cummax().to_numpy()
        begins = first | (ordered.start >= np.r_[0, reach[:-1]])
    else:
        begins = first | np.r_[True, ordered.start[1:] != ordered.start[:-1]]
    bounds = np.flatnonzero(begins)
    values, valid = [], []
    for function, data, ok in zip(functions, ordered.values, ordered.valid, strict=True):
        reduce = _REDUCE[function]
        neutral = 0 if reduce is np.add else _extreme(data.dtype, low=reduce is np.maximum)
        values.append(reduce.reduceat(np.where(ok, data, neutral), bounds))
        counted = function == "count"
        valid.append(np.ones(len(bounds), bool) if counted else np.logical_or.reduceat(ok, bounds))
    return Windows(
        ordered.ids[bounds],
        ordered.at[bounds],
        np.minimum.reduceat(ordered.start, bounds),
        np.maximum.reduceat(ordered.end, bounds),
        tuple(values),
        tuple(valid),
    )


def _extreme(dtype: np.dtype[Any], *, low: bool) -> Any:
    if dtype.kind == "f":
        return -np.inf if low else np.inf
    info = np.iinfo(dtype)
    return info.min if low else info.max


def key_ids(keys: Sequence[str], *tables: pa.Table) -> list[Array]:
    """Each table's keys as integers, equal for equal keys across the tables (nulls too)."""
    sizes = [t.num_rows for t in tables]
    encoded = []
    for key in keys:
        kind = tables[0].schema.field(key).type
        joined = pa.concat_arrays([t[key].combine_chunks().cast(kind) for t in tables])
        codes: Any = pc.dictionary_encode(joined, null_encoding="encode")
        indices = np.asarray(codes.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        encoded.append((indices, len(codes.dictionary)))
    return np.split(joint_codes(encoded), np.cumsum(sizes)[:-1])


def valid_mask(column: Any) -> Array:
    """Which values of an Arrow column are not null."""
    return np.asarray(pc.is_valid(column).to_numpy(zero_copy_only=False), dtype=bool)


def cell_lengths(cells: Any) -> Array:
    """How many values each array cell of a list column holds (0 for a null cell)."""
    lengths: Any = pc.fill_null(pc.list_value_length(cells), 0)
    return np.asarray(lengths.to_numpy(), dtype=np.int64)


def flatten(cells: Any, lengths: Array) -> Any:
    """The arrays in ``cells`` one after the other; a null cell as ``lengths`` nulls."""
    if cells.null_count:
        rows = cells.to_pylist()
        cells = pa.chunked_array(
            [[[None] * int(n) if c is None else c for c, n in zip(rows, lengths, strict=True)]],
            cells.type,
        )
    flat: Any = pc.list_flatten(cells)
    return flat.combine_chunks() if isinstance(flat, pa.ChunkedArray) else flat


ARROW_KINDS = {"bigint": pa.int64(), "double": pa.float64()}
"""The Arrow type of an aggregate's values, by its declared kind."""


def numbers(values: Any, kind: str) -> tuple[Array, Array]:
    """Arrow ``values`` as NumPy of ``kind`` (``bigint`` or ``double``), and which are not null.

    Raises:
        pyarrow.ArrowInvalid: A value does not fit ``kind`` (a fraction for a ``bigint``).
    """
    typed: Any = values.cast(ARROW_KINDS[kind])
    valid = valid_mask(typed)
    filled: Any = pc.fill_null(typed, 0)
    return np.asarray(filled.to_numpy(zero_copy_only=False)), valid


def cells(values: Array, valid: Array, starts: Array) -> Any:
    """One array cell per run that begins at ``starts``, nulls where not ``valid``."""
    offsets = pa.array(np.r_[starts, len(values)].astype(np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values, mask=~valid))
