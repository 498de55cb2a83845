"""The state table as a changelog, and the live state it describes.

An operator's state table holds one row per key and epoch in which the key's state changed
(``_epoch``), with ``_deleted`` marking removals. The state as of epoch e is the latest row
per key among those with ``_epoch <= e``, without tombstones. Restore, compaction and
validation compute it here, with Arrow and without Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_abs.operators.keys import BoolArray, IntArray, key_arrays
from pyspark_abs.operators.schema import DELETED, EPOCH
from pyspark_abs.runtime import usable_cores


def latest_per_key(
    changes: pa.Table, keys: Sequence[str], epoch: int | None = None, *, keep_deleted: bool = False
) -> pa.Table:
    """The latest change of every key, as of ``epoch`` (None: all changes).

    Args:
        changes: Rows of a state table.
        keys: The key columns.
        epoch: Ignore changes of later epochs.
        keep_deleted: Keep tombstones (the latest change of a removed key).
    """
    return changes.take(latest_rows(changes, keys, epoch, keep_deleted=keep_deleted))


def latest_rows(
    changes: pa.Table, keys: Sequence[str], epoch: int | None = None, *, keep_deleted: bool = False
) -> IntArray:
    """The row numbers, ascending, of the changes :func:`latest_per_key` keeps.

    For a caller that reorders them before taking: one copy of the rows instead of two.
    """
    if not changes.num_rows:
        return np.zeros(0, dtype=np.int64)
    epochs = np.asarray(changes[EPOCH].to_numpy(zero_copy_only=False), dtype=np.int64)
    rows = None
    if epoch is not None and int(epochs.max()) > epoch:
        rows = np.flatnonzero(epochs <= epoch)
        epochs = epochs[rows]
    key_columns = changes.select(list(keys))
    code = _key_codes(key_columns if rows is None else key_columns.take(rows), keys)
    latest = _last_of_each(code, epochs)
    if rows is not None:
        latest = rows[latest]
    if keep_deleted:
        return latest
    tombstones: Any = changes[DELETED].take(latest)
    deleted: Any = pc.fill_null(tombstones, False)  # null counts as live
    live: BoolArray = ~np.asarray(deleted.to_numpy(zero_copy_only=False), dtype=np.bool_)
    return latest[live]


def stable_order(values: IntArray) -> IntArray:
    """``np.argsort(values, kind="stable")``, faster for integers of a narrow span.

    A span below 2**16 is sorted as 16-bit integers (numpy sorts those by radix, in one
    pass); a span that leaves room for the row numbers in 63 bits is sorted as values and
    row numbers packed into one integer (unique, so numpy's vectorized sort needs no
    stability); a wider span falls back to the stable argsort.
    """
    if len(values) < 2:
        return np.arange(len(values), dtype=np.int64)
    low, high = int(values.min()), int(values.max())
    if high - low < 1 << 16:  # subtracting modulo 2**16 keeps the order of such a span
        narrow = values.astype(np.uint16)
        narrow -= np.uint16(low % (1 << 16))
        return np.argsort(narrow, kind="stable").astype(np.int64, copy=False)
    row_bits = int(len(values) - 1).bit_length()
    if (high - low) >> (63 - row_bits):
        return np.argsort(values, kind="stable").astype(np.int64, copy=False)
    packed = values - low  # each step in place: fresh pages of a large array cost
    packed <<= row_bits
    packed |= np.arange(len(values), dtype=np.int64)
    _sort_on_two_cores(packed)
    packed &= (1 << row_bits) - 1
    return packed


def _sort_on_two_cores(values: IntArray) -> None:
    """Sort in place: a large array's halves in two threads, then one merge of the two runs.

    numpy's stable sort of 64-bit integers is a timsort, which merges two sorted runs in one
    pass.
    """
    if len(values) < _TWO_CORES_FROM or usable_cores() < 2:
        values.sort()
        return
    half = len(values) // 2
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(np.ndarray.sort, (values[:half], values[half:])))
    values.sort(kind="stable")


_TWO_CORES_FROM = 1 << 20


def _last_of_each(code: IntArray, epochs: IntArray) -> IntArray:
    """Ascending positions of the row of the highest epoch (then the last one) per code."""
    by_epoch = None
    if (epochs[1:] < epochs[:-1]).any():
        by_epoch = stable_order(epochs)
        code = code[by_epoch]
    order = stable_order(code)
    ordered = code[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    keep = np.zeros(len(order), dtype=bool)
    keep[order[last] if by_epoch is None else by_epoch[order[last]]] = True
    return np.flatnonzero(keep)


def duplicate_changes(changes: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Rows whose (key, ``_epoch``) occurs more than once: an epoch committed twice."""
    if not changes.num_rows:
        return changes
    codes = pa.array(_key_codes(changes, [*keys, EPOCH]))
    counts: pa.StructArray = pc.value_counts(codes)
    tally = np.asarray(counts.field("counts").to_numpy(zero_copy_only=False))
    repeated = counts.field("values").filter(pa.array(tally > 1))
    return changes.filter(pc.is_in(codes, value_set=repeated))


def _key_codes(table: pa.Table, columns: Sequence[str]) -> np.ndarray[Any, np.dtype[np.int64]]:
    """One integer per row, equal for rows with equal values in ``columns`` (nulls too).

    Integer keys without nulls are their own codes (uint64 wraps, which keeps them
    distinct): hashing tens of millions of them costs more than sorting them.
    """
    (keys,) = key_arrays([table], columns)
    if pa.types.is_integer(keys.type) and not keys.null_count:
        return np.asarray(keys.to_numpy()).astype(np.int64, copy=False)
    encoded: Any = pc.dictionary_encode(keys, null_encoding="encode")
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
