"""Key groups: the unit of state partitioning (Flink's key groups, max parallelism).

A key belongs to key group ``pmod(hash(key), K)``, computed by Spark's own Murmur3 ``hash``.
Spark groups the input by key group and the operator processes a whole key group per call,
which costs one pandas call per key group instead of one per key. K is fixed for a
checkpoint; restoring from a snapshot may choose another K, because the snapshot stores each
key's state, not each key group's.
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
