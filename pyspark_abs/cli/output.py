"""How the ``pyspark-abs`` command prints: aligned tables, JSON, durations and sizes."""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Sequence
from typing import Any

from pyspark_abs.manifest.entries import EpochStatus


def merged(status: EpochStatus, snapshot_epoch: int | None) -> str:
    """The note of a MERGED epoch: the snapshot it was merged into."""
    return f"merged into snapshot {snapshot_epoch}" if status is EpochStatus.MERGED else ""


def rounded(value: Any) -> Any:
    """``value`` with its floats (durations in ms) rounded to a tenth."""
    if isinstance(value, float):
        return round(value, 1)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def print_json(data: Any) -> None:
    """Print ``data`` as indented JSON (datetimes in ISO 8601, bytes in hex)."""
    print(json.dumps(data, default=_json_default, indent=2))


def _json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print rows under a header in aligned columns."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header)]
    for line in [header, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )


def cell(value: Any) -> str:
    """A value as a table cell (None as ``null``)."""
    return "null" if value is None else str(value)


def or_dash(value: object) -> str:
    """A value, or ``-`` for None."""
    return "-" if value is None else str(value)


def ms(value: float | None) -> str:
    """A duration in whole milliseconds, or ``-``."""
    return "-" if value is None else f"{value:.0f} ms"


def size(value: int) -> str:
    """A byte count in B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{value:.0f} {unit}"
        value //= 1024
    return f"{value} GiB"


def epoch_or_name(text: str) -> int | str:
    """An epoch number, or a savepoint's name (names start with a letter)."""
    return int(text) if text.isdigit() else text


def progress(line: str) -> None:
    """Report the progress of a long operation on standard error."""
    print(line, file=sys.stderr, flush=True)
