"""Matching keys across Arrow tables with Arrow's hash kernels.

A key group's current state, its input rows, and what the operator returned are separate
tables; the operator stage must find, for example, where each returned key sits in the
current state. Arrow's ``index_in``/``is_in`` do this in C++, with nulls and NaN matching
themselves, but only for one column. Keys of several columns are first turned into one
integer code per row, with codes computed jointly over all the tables so they compare.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BoolArray = np.ndarray[Any, np.dtype[np.bool_]]
IntArray = np.ndarray[Any, np.dtype[np.int64]]
KeyArray = Any
"""A one-column Arrow array of keys (pyarrow's type stubs cannot express it precisely)."""


def key_arrays(tables: Sequence[pa.Table], columns: Sequence[str]) -> list[KeyArray]:
    """One array per table identifying each row's key, comparable across the tables.

    Args:
        tables: Tables that all hold the key columns.
        columns: The key columns.
    """
    if len(columns) == 1:
        return [t.column(columns[0]).combine_chunks() for t in tables]
    lengths = [t.num_rows for t in tables]
    encoded_columns = []
    for column in columns:
        values = pa.concat_arrays([t.column(column).combine_chunks() for t in tables])
        encoded: Any = pc.dictionary_encode(values, null_encoding="encode")
        indices = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        encoded_columns.append((indices, len(encoded.dictionary)))
    codes = joint_codes(encoded_columns)
    bounds = np.cumsum([0, *lengths])
    return [pa.array(codes[bounds[i] : bounds[i + 1]]) for i in range(len(tables))]


def joint_codes(columns: Sequence[tuple[IntArray, int]]) -> IntArray:
    """One integer per row, equal exactly where every column's code is equal.

    Args:
        columns: Per key column, each row's code (from 0) and how many codes there are.
    """
    codes, _ = columns[0]
    for indices, count in columns[1:]:
        codes = np.unique(codes * count + indices, return_inverse=True)[1].astype(np.int64)
    return codes.reshape(-1)


def positions(keys: KeyArray, among: KeyArray) -> IntArray:
    """For each key, its row in ``among`` (keys there are unique), or -1.

    Arrow hashes the value set, so a few keys looked up among many rows (changed keys in a
    key group's whole state, every epoch) hash the few and scan the many instead.
    """
    if not len(keys) or not len(among):
        return np.full(len(keys), -1, dtype=np.int64)
    if len(among) > 4 * len(keys) and len(pc.unique(keys)) == len(keys):
        hit: Any = pc.index_in(among, value_set=keys)
        at = np.asarray(pc.fill_null(hit, -1).to_numpy(), dtype=np.int64)
        rows = np.flatnonzero(at >= 0)
        found = np.full(len(keys), -1, dtype=np.int64)
        found[at[rows]] = rows
        return found
    looked_up: Any = pc.index_in(keys, value_set=among)
    return np.asarray(pc.fill_null(looked_up, -1).to_numpy(), dtype=np.int64)


def contains(keys: KeyArray, among: KeyArray) -> BoolArray:
    """For each key, whether it occurs in ``among``."""
    if not len(keys) or not len(among):
        return np.zeros(len(keys), dtype=bool)
    found: Any = pc.is_in(keys, value_set=among)
    return np.asarray(found.to_numpy(zero_copy_only=False), dtype=bool)


def repeated(keys: KeyArray) -> BoolArray:
    """For each key, whether it occurs more than once."""
    if len(keys) == len(pc.unique(keys)):
        return np.zeros(len(keys), dtype=bool)
    counts: Any = pc.value_counts(keys)
    tally = np.asarray(counts.field("counts").to_numpy(zero_copy_only=False))
    return contains(keys, counts.field("values").filter(tally > 1))
