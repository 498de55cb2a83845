"""The rows a per-key function returns, collected over its key group, one output each."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from pyspark_abs.errors import SchemaMismatchError
from pyspark_abs.operators.schema import check_columns, check_names, object_frame


class OutputRows:
    """Rows a per-key function returned for one output, collected over a key group."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self.frames: list[pd.DataFrame] = []
        self.records: list[Mapping[str, Any]] = []

    def add(self, rows: Any, what: str) -> None:
        """Add what the function returned for one key, checking its columns."""
        if rows is None:
            return
        if isinstance(rows, pd.DataFrame):
            check_columns(rows, self.columns, what)
            self.frames.append(rows)
        elif isinstance(rows, Mapping):
            self._add_record(rows, what)
        elif isinstance(rows, Iterable) and not isinstance(rows, (str, bytes)):
            for row in rows:
                if not isinstance(row, Mapping):
                    raise SchemaMismatchError(
                        f"{what}: returned rows must be dicts, got {type(row).__name__}"
                    )
                self._add_record(row, what)
        else:
            raise SchemaMismatchError(
                f"{what}: returned {type(rows).__name__}; return a DataFrame, a dict (one "
                f"row), a list of dicts, or None"
            )

    def _add_record(self, row: Mapping[str, Any], what: str) -> None:
        if len(row) != len(self.columns) or any(name not in row for name in self.columns):
            check_names([str(k) for k in row], self.columns, what)
        self.records.append(row)

    def frame(self) -> pd.DataFrame | None:
        """All collected rows as one frame, or None if there are none."""
        frames = list(self.frames)
        if self.records:
            frames.append(object_frame(self.records, self.columns))
        if not frames:
            return None
        if len(frames) == 1:
            return frames[0]
        # frames whose dtypes differ meet as Python values: one key's float column must not
        # turn another key's integers into floats
        mixed = [c for c in self.columns if len({str(f[c].dtype) for f in frames}) > 1]
        if mixed:
            frames = [f.astype(dict.fromkeys(mixed, object)) for f in frames]
        return pd.concat(frames, ignore_index=True)


def collect(returned: Any, collected: dict[str, OutputRows], where: str) -> None:
    """File what the function returned for one key under its outputs."""
    if len(collected) == 1:
        ((name, rows),) = collected.items()
        rows.add(returned, f"{where}: output {name!r}")
        return
    if returned is None:
        return
    names = list(collected)
    if not isinstance(returned, Mapping) or not set(returned) <= set(names):
        raise SchemaMismatchError(
            f"{where}: an operator with several outputs returns a dict from output name "
            f"({names}) to rows, got {_short(returned)}"
        )
    for name, rows in returned.items():
        collected[name].add(rows, f"{where}: output {name!r}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
