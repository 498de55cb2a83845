"""What the sources share about Spark's readers: read limits, and checks of reader options.

Spark's read limits for the package's stream readers have stand-ins on Spark 4.0 and 4.1.

Spark 4.2 gave Python stream readers admission control: ``latestOffset(start, limit)`` with a
read limit, and ``availableNow`` through :class:`SupportsTriggerAvailableNow`. Spark 4.0 and
4.1 call ``latestOffset()`` alone, and run ``availableNow`` by asking for the latest offset
once. The stand-ins let a reader be defined on those versions too; Spark never calls them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark_abs.errors import ConfigError


class _ReadLimit:
    """Stand-in for ``ReadLimit`` before Spark 4.2."""


class _ReadAllAvailable(_ReadLimit):
    """Stand-in for ``ReadAllAvailable`` before Spark 4.2."""


@dataclass
class _ReadMaxRows(_ReadLimit):
    """Stand-in for ``ReadMaxRows`` before Spark 4.2."""

    max_rows: int


@dataclass
class _ReadMaxFiles(_ReadLimit):
    """Stand-in for ``ReadMaxFiles`` before Spark 4.2."""

    max_files: int


class _SupportsTriggerAvailableNow:
    """Stand-in for ``SupportsTriggerAvailableNow`` before Spark 4.2."""


try:
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxFiles,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # Spark 4.0 and 4.1
    ReadLimit = _ReadLimit  # type: ignore[misc,assignment]
    ReadAllAvailable = _ReadAllAvailable  # type: ignore[misc,assignment]
    ReadMaxRows = _ReadMaxRows  # type: ignore[misc,assignment]
    ReadMaxFiles = _ReadMaxFiles  # type: ignore[misc,assignment]
    SupportsTriggerAvailableNow = _SupportsTriggerAvailableNow  # type: ignore[misc,assignment]

__all__ = [
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxFiles",
    "ReadMaxRows",
    "SupportsTriggerAvailableNow",
]


def require_text_options(options: object, source: str) -> None:
    """Refuse reader options that are not a mapping of text to text.

    Raises:
        ConfigError: Naming ``source`` and the options given.
    """
    if not isinstance(options, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in options.items()
    ):
        raise ConfigError(
            f"{source}: options must be a dict of text to text (as Spark's reader options), "
            f"got {options!r}"
        )
