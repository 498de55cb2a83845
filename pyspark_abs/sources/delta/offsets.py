"""Offsets of the Delta source, and planning which rows a micro-batch reads (no I/O)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark_abs.errors import ConfigError

SOURCE_NAME = "pyspark_abs_delta"
"""The data source's short name, and the ``source`` tag of its offsets."""


@dataclass(frozen=True, order=True)
class Offset:
    """A position in the stream: every row before row ``index`` of ``version`` is read.

    Attributes:
        version: A table version.
        index: A row index within the rows that ``version`` appends.
        tag: The stream's tag, if it has one; not part of the position.
    """

    version: int
    index: int
    tag: str | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The offset as Spark stores it in the checkpoint's offset log."""
        value: dict[str, Any] = {
            "source": SOURCE_NAME,
            "version": self.version,
            "index": self.index,
        }
        if self.tag is not None:
            value["tag"] = self.tag
        return value

    @classmethod
    def parse(cls, value: object) -> Offset:
        """Read an offset written by :meth:`to_dict`.

        Raises:
            ValueError: ``value`` is not an offset of this source.
        """
        if not isinstance(value, Mapping) or value.get("source") != SOURCE_NAME:
            raise ValueError(f"{value!r} is not an offset of the {SOURCE_NAME} source")
        if set(value) - {"tag"} != {"source", "version", "index"}:
            raise ValueError(
                f"offset {dict(value)!r} must have exactly the keys source, version and index, "
                f"and optionally tag"
            )
        version, index, tag = value["version"], value["index"], value.get("tag")
        for name, number in (("version", version), ("index", index)):
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise ValueError(f"offset {dict(value)!r}: {name} must be an integer >= 0")
        if tag is not None and not isinstance(tag, str):
            raise ValueError(f"offset {dict(value)!r}: tag must be a string")
        return cls(version, index, tag)


def parse_offset_json(offset_json: str) -> dict[str, Any]:
    """One offset of the source as Spark wrote it to a checkpoint's offset log, as a dict.

    Raises:
        ConfigError: The text is not JSON, or not an offset of this source.
    """
    try:
        value = json.loads(offset_json)
    except (json.JSONDecodeError, TypeError) as err:
        raise ConfigError(f"{offset_json!r} is not an offset: {err}") from None
    try:
        return Offset.parse(value).to_dict()
    except ValueError as err:
        raise ConfigError(str(err)) from None


@dataclass(frozen=True)
class VersionRows:
    """The rows a table version appends, as the stream sees them.

    Attributes:
        version: The table version.
        files: Row counts of the version's data files, in log order.
        blocked: Why the stream cannot read this version, or None if it can.
    """

    version: int
    files: tuple[int, ...] = ()
    blocked: str | None = None


@dataclass(frozen=True)
class RowSlice:
    """Rows ``[start, stop)`` of one data file of one version.

    Attributes:
        version: The table version.
        file: The file's position among the version's data files.
        start: First row, within the file.
        stop: End row (exclusive), within the file.
    """

    version: int
    file: int
    start: int
    stop: int


@dataclass(frozen=True)
class Planned:
    """The end offset of the next micro-batch.

    Attributes:
        end: The end offset; equal to the start offset when nothing can be read.
        blocked: Set when planning stopped at a version the stream cannot read: the reason.
    """

    end: Offset
    blocked: str | None = None


def _contiguous(versions: Iterable[VersionRows], first: int) -> Iterator[VersionRows]:
    expected = first
    for entry in versions:
        if entry.version != expected:
            raise ValueError(f"expected version {expected}, got version {entry.version}")
        expected += 1
        yield entry


def plan_next(
    versions: Iterable[VersionRows],
    start: Offset,
    *,
    max_rows: int | None = None,
    max_files: int | None = None,
) -> Planned:
    """The end offset of a micro-batch that starts at ``start``.

    Versions are consumed lazily, and no further than the limits need: the version after the
    one that exhausts a limit is not read. A file cut by ``max_rows`` counts as one file;
    files without rows to read count for nothing. Versions without rows are skipped.

    Args:
        versions: The versions from ``start.version`` on, in order, up to the last version
            the batch may read.
        start: The batch's start offset.
        max_rows: The most rows the batch may read, or None for no limit.
        max_files: The most files (whole or in part) the batch may read, or None.

    Returns:
        The end offset, and why planning stopped early if it met an unreadable version.

    Raises:
        ValueError: The versions are not contiguous from ``start.version``, a limit is not
            positive, or ``start.index`` is beyond the rows of its version.
    """
    for name, limit in (("max_rows", max_rows), ("max_files", max_files)):
        if limit is not None and limit < 1:
            raise ValueError(f"{name} must be at least 1, got {limit}")
    rows_left, files_left = max_rows, max_files
    end = start
    for entry in _contiguous(versions, start.version):
        if entry.blocked is not None:
            return Planned(end, entry.blocked)
        skip = start.index if entry.version == start.version else 0
        if skip > sum(entry.files):
            raise ValueError(
                f"offset index {skip} is beyond the {sum(entry.files)} rows of version "
                f"{entry.version}"
            )
        position = 0
        for rows in entry.files:
            low, high = max(position, skip), position + rows
            position = high
            if high <= low:
                continue
            if rows_left == 0 or files_left == 0:
                return Planned(Offset(entry.version, low))
            take = high - low if rows_left is None else min(high - low, rows_left)
            if rows_left is not None:
                rows_left -= take
            if files_left is not None:
                files_left -= 1
            if low + take < high:
                return Planned(Offset(entry.version, low + take))
        end = Offset(entry.version + 1, 0)
        if rows_left == 0 or files_left == 0:
            break
    return Planned(end)


def plan_slices(versions: Iterable[VersionRows], start: Offset, end: Offset) -> list[RowSlice]:
    """The file slices holding the rows from ``start`` (inclusive) to ``end`` (exclusive).

    Args:
        versions: The versions from ``start.version`` on, in order, at least up to the last
            version with rows before ``end``.
        start: The batch's start offset.
        end: The batch's end offset.

    Raises:
        ValueError: ``end`` is before ``start``, the versions are not contiguous or stop too
            early, an offset index is beyond the rows of its version, or a version in the
            range cannot be read (the message is the reason).
    """
    if end < start:
        raise ValueError(f"end offset {end} is before start offset {start}")
    last = end.version if end.index > 0 else end.version - 1
    if last < start.version:
        return []
    slices: list[RowSlice] = []
    seen = start.version - 1
    for entry in _contiguous(versions, start.version):
        if entry.version > last:
            break
        seen = entry.version
        if entry.blocked is not None:
            raise ValueError(entry.blocked)
        total = sum(entry.files)
        low = start.index if entry.version == start.version else 0
        high = end.index if entry.version == end.version else total
        if max(low, high) > total:
            raise ValueError(
                f"offset index {max(low, high)} is beyond the {total} rows of version "
                f"{entry.version}"
            )
        position = 0
        for number, rows in enumerate(entry.files):
            first, stop = max(position, low), min(position + rows, high)
            if stop > first:
                slices.append(RowSlice(entry.version, number, first - position, stop - position))
            position += rows
    if seen < last:
        raise ValueError(f"versions stop at {seen}, before version {last} of offset {end}")
    return slices
