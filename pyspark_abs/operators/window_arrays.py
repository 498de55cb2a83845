"""The arithmetic of the window operators on flat NumPy arrays, without pandas per step.

A key group's windows are parallel arrays: each window's key (an integer id), the row that
holds its key's columns, its start and end in ms, and per aggregate its values and which of
them are not null. Merging sorts them once by key and start and reduces each run of windows
that are one window (tumbling: the same start; sessions: overlapping) with ``reduceat``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pandas as pd

from pyspark_abs.operators.keys import joint_codes

Array = np.ndarray[Any, Any]
Kind = Literal["Int64", "float64"]
"""The pandas type an aggregate's values are kept in while a key group runs."""

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


def key_ids(keys: Sequence[str], *frames: pd.DataFrame) -> list[Array]:
    """Each frame's keys as integers, equal for equal keys across the frames (nulls too)."""
    sizes = [len(f) for f in frames]
    encoded = []
    for key in keys:
        columns = [f[key].to_numpy() for f in frames]
        kinds = {c.dtype for c in columns if len(c)}
        kind = kinds.pop() if len(kinds) == 1 else np.dtype(object)
        joined = np.concatenate([c.astype(kind, copy=False) for c in columns])
        codes, uniques = pd.factorize(joined)
        codes[codes < 0] = len(uniques)  # every kind of null is one key, as Spark groups them
        encoded.append((codes.astype(np.int64), len(uniques) + 1))
    return np.split(joint_codes(encoded), np.cumsum(sizes)[:-1])


def flatten(cells: pd.Series[Any], lengths: Array) -> Array:
    """The arrays in ``cells`` one after the other; a null cell as ``lengths`` nulls."""
    parts = [
        np.full(n, None, dtype=object) if cell is None else np.asarray(cell)
        for cell, n in zip(cells, lengths, strict=True)
    ]
    if not parts:
        return np.empty(0, dtype=object)
    kinds = {p.dtype for p in parts}
    if len(kinds) == 1:
        return np.concatenate(parts)
    return np.concatenate([p.astype(object) for p in parts])


def numbers(values: pd.Series[Any] | Array, dtype: Kind) -> tuple[Array, Array]:
    """``values`` in a pandas ``dtype`` (``Int64`` or ``float64``), and which are not null."""
    typed = pd.Series(values).astype(dtype)
    valid = typed.notna().to_numpy()
    kind = np.int64 if dtype == "Int64" else np.float64
    return typed.to_numpy(dtype=kind, na_value=0), valid


def split_cells(values: Array, valid: Array, starts: Array) -> Array:
    """One cell per run that begins at ``starts``: its values as an array, nulls as None."""
    if not valid.all():
        values = values.astype(object)
        values[~valid] = None
    cells = np.empty(len(starts), dtype=object)
    ends = [*starts[1:].tolist(), len(values)] if len(starts) else []
    for i, (begin, end) in enumerate(zip(starts.tolist(), ends, strict=True)):
        cells[i] = values[begin:end]
    return cells


def nullable(values: Array, valid: Array, dtype: Kind) -> pd.api.extensions.ExtensionArray | Array:
    """``values`` as a pandas column of ``dtype`` (``Int64`` or ``float64``) with nulls."""
    if dtype == "Int64":
        return pd.arrays.IntegerArray(values.astype(np.int64), ~valid)
    return np.where(valid, values, np.nan)
