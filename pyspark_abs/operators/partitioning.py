"""Partitioning by key: keys into key groups (Flink's key groups), key groups into slots.

A key belongs to key group ``pmod(hash(key), K)``, computed by Spark's own Murmur3 ``hash``.
The operator processes whole key groups, vectorised; Spark groups the key groups into slots,
one per shuffle partition (:func:`slot_values`), and one call serves all key groups of a
slot. K is fixed for a checkpoint; restoring from a snapshot may choose another K, because
the snapshot stores each key's state, not each key group's.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column
from pyspark.sql import functions as F

from pyspark_abs.errors import ConfigError


def key_group_column(key_columns: Sequence[str], key_groups: int) -> Column:
    """The Spark expression that maps a row's key to its key group.

    Raises:
        ConfigError: ``key_groups`` is not a positive integer.
    """
    if isinstance(key_groups, bool) or not isinstance(key_groups, int) or key_groups <= 0:
        raise ConfigError(f"key_groups must be a positive integer, got {key_groups!r}")
    return F.pmod(F.hash(*[F.col(c) for c in key_columns]), F.lit(key_groups)).cast("int")


def slot_values(slots: int) -> tuple[int, ...]:
    """The carrier's grouping value of each of ``slots`` slots.

    Slot ``s`` is the smallest non-negative integer that Spark's hash partitioning over
    ``slots`` partitions sends to partition ``s``: with as many shuffle partitions as slots,
    each slot is one partition, and one Python call serves all its key groups.
    """
    values: dict[int, int] = {}
    candidate = 0
    while len(values) < slots:
        values.setdefault(murmur3_int(candidate) % slots, candidate)
        candidate += 1
    return tuple(values[s] for s in range(slots))


def slot_of(key_group: int, slots: int) -> int:
    """The slot (index into :func:`slot_values`) serving ``key_group``."""
    return key_group % slots


def slot_column(key_group: Column, slots: int) -> Column:
    """The Spark expression that maps a key group to its slot's grouping value."""
    values = F.array(*[F.lit(v) for v in slot_values(slots)])
    return F.element_at(values, F.pmod(key_group, F.lit(slots)) + 1)


_MASK = 0xFFFFFFFF


def murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash`` of one ``int`` value (Murmur3 x86 32-bit, seed 42), signed."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & _MASK

    k1 = rotl((value & _MASK) * 0xCC9E2D51 & _MASK, 15) * 0x1B873593 & _MASK
    h1 = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1
