"""State schema evolution: how an operator's older state becomes its declared state.

An operator declares its state schema; a snapshot root may hold state written by an older
version with another one. :func:`compare_state` lists each column difference and whether
the operator's :class:`StateEvolution` covers it; :func:`evolve_rows` applies the
column rules to the live state with Arrow. The rules:

- a column of the same type is kept;
- a widened type is cast (integer to a wider integer, float to double, an integer of up to
  32 bits to double, decimal to a decimal that loses no digit on either side of the point);
- a renamed column (``renamed={"old": "new"}``) keeps its values, widened if needed;
- a new column takes the value given in ``added``, or what a function of the old state
  computes;
- an old column is dropped only when ``dropped`` names it;
- anything else (a narrowed or changed type, a new column without a value) is refused,
  unless ``migrate`` rewrites the whole state with DataFrame code.

Key columns never change: state is partitioned by them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa

from pyspark_abs.errors import OperatorDefinitionError, SchemaMismatchError
from pyspark_abs.operators.arrow_types import same_type
from pyspark_abs.operators.schema import STATELESS_COLUMN, TIMERS, ddl_type, to_frame

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

AddedValue = Any
"""A new column's value: a constant (None for null), or ``fn(old_state: pd.DataFrame)``
returning one value per row (a Series, an array or a list) or a constant."""


@dataclass(frozen=True)
class StateEvolution:
    """How state written by an earlier version of an operator becomes its declared state.

    The rules stay declared after the state has been migrated: a root whose state already
    has the declared schema is left alone, so they are harmless there.

    Attributes:
        added: New state column to its value: a constant, or a function of the old state
            (a pandas frame of the key and old state columns) returning one value per row.
        renamed: Old column name to new column name.
        dropped: Old columns whose values are thrown away.
        migrate: Rewrites the whole state instead of the column rules:
            ``fn(old_state: DataFrame) -> DataFrame``. It gets the key and old state
            columns and returns the key and declared state columns; keys it leaves out are
            removed, and the keys it keeps keep their timeouts.
        renamed_from: The operator's earlier id (name): its state moves to this operator's
            state table, through the same rules.
    """

    added: Mapping[str, AddedValue] = field(default_factory=dict)
    renamed: Mapping[str, str] = field(default_factory=dict)
    dropped: Sequence[str] = ()
    migrate: Callable[[DataFrame], DataFrame] | None = None
    renamed_from: str | None = None

    def check(self, operator: str, key: Sequence[str], state: pa.Schema) -> None:
        """Check the rules against the operator's declaration.

        Raises:
            OperatorDefinitionError: A rule names a column the declaration contradicts.
        """
        where = f"operator {operator!r}: evolution="
        if not isinstance(self.added, Mapping) or not isinstance(self.renamed, Mapping):
            raise OperatorDefinitionError(f"{where} added= and renamed= must be dicts")
        if isinstance(self.dropped, str) or not isinstance(self.dropped, Sequence):
            raise OperatorDefinitionError(f"{where} dropped= must be a list of column names")
        if self.migrate is not None and not callable(self.migrate):
            raise OperatorDefinitionError(f"{where} migrate= must be a function")
        if self.renamed_from is not None and (
            not isinstance(self.renamed_from, str)
            or not self.renamed_from
            or self.renamed_from == operator
        ):
            raise OperatorDefinitionError(
                f"{where} renamed_from= must be the operator's earlier name, got "
                f"{self.renamed_from!r}"
            )
        if self.migrate is not None and (self.added or self.renamed or self.dropped):
            raise OperatorDefinitionError(
                f"{where} migrate= rewrites the whole state; leave added=, renamed= and "
                f"dropped= out, or drop migrate="
            )
        declared = set(state.names)
        problems = [
            f"added column {n!r} is not a declared state column"
            for n in self.added
            if n not in declared
        ]
        problems += [
            f"renamed column {old!r} -> {new!r}: {new!r} is not a declared state column"
            for old, new in self.renamed.items()
            if new not in declared
        ]
        problems += [
            f"column {n!r} is both added and the target of a rename"
            for n in set(self.added) & set(self.renamed.values())
        ]
        problems += [
            f"dropped column {n!r} is a declared state column"
            for n in self.dropped
            if n in declared
        ]
        problems += [f"key column {n!r} cannot be evolved" for n in self.touched() if n in key]
        if len(set(self.renamed.values())) != len(self.renamed):
            problems.append("two columns are renamed to the same name")
        if problems:
            raise OperatorDefinitionError(f"{where} {'; '.join(problems)}")

    def touched(self) -> set[str]:
        """Every column name a rule mentions."""
        return {*self.added, *self.renamed, *self.renamed.values(), *self.dropped}


class Change(str, Enum):
    """What happens to one state column."""

    KEPT = "kept"
    WIDENED = "widened"
    RENAMED = "renamed"
    ADDED = "added"
    DROPPED = "dropped"
    MIGRATED = "migrated"
    REFUSED = "refused"


@dataclass(frozen=True)
class ColumnChange:
    """One state column's difference between the stored and the declared state.

    Attributes:
        column: The declared column (the old one for a drop).
        change: What happens to it.
        detail: The types or names involved, as people read them.
        source: The old column its values come from (KEPT, WIDENED, RENAMED).
        fix: For a refused change, the option that would allow it.
    """

    column: str
    change: Change
    detail: str
    source: str | None = None
    fix: str | None = None

    def __str__(self) -> str:
        text = f"{self.column}: {self.change.value} ({self.detail})"
        return f"{text}; {self.fix}" if self.fix else text


@dataclass(frozen=True)
class StateComparison:
    """The stored state's columns against the declared ones.

    Attributes:
        changes: One entry per column that differs, plus the kept ones.
        key_problems: Differences in the key columns, which nothing can migrate.
    """

    changes: tuple[ColumnChange, ...]
    key_problems: tuple[str, ...] = ()

    @property
    def differs(self) -> bool:
        """Whether the stored state needs a migration (or cannot have one)."""
        return bool(self.key_problems) or any(c.change is not Change.KEPT for c in self.changes)

    @property
    def refused(self) -> tuple[ColumnChange, ...]:
        """The changes nothing declared allows."""
        return tuple(c for c in self.changes if c.change is Change.REFUSED)

    @property
    def compatible(self) -> bool:
        """Whether the declared rules can migrate the stored state."""
        return not self.key_problems and not self.refused

    @property
    def migrations(self) -> tuple[ColumnChange, ...]:
        """The changes a migration makes."""
        return tuple(c for c in self.changes if c.change not in (Change.KEPT, Change.REFUSED))

    def summary(self) -> str:
        """Every difference, one per line, with the option that would allow a refused one."""
        lines = [f"key: {p}" for p in self.key_problems]
        lines += [str(c) for c in self.changes if c.change is not Change.KEPT]
        return "\n".join(lines)


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether every value of ``old`` is a value of ``new`` (a cast that loses nothing)."""
    if pa.types.is_integer(old) and pa.types.is_integer(new):
        signed = pa.types.is_signed_integer
        return bool(signed(old) == signed(new) and new.bit_width > old.bit_width)
    if pa.types.is_floating(old) and pa.types.is_floating(new):
        return bool(new.bit_width > old.bit_width)
    if pa.types.is_integer(old) and pa.types.is_float64(new):
        return bool(old.bit_width <= 32)
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        integer_digits = new.precision - new.scale >= old.precision - old.scale
        return bool(integer_digits and new.scale >= old.scale and new != old)
    return False


def compare_state(
    stored_key: pa.Schema,
    stored_state: pa.Schema,
    declared_key: pa.Schema,
    declared_state: pa.Schema,
    evolution: StateEvolution | None,
) -> StateComparison:
    """Compare stored key and state columns with the declared ones, under ``evolution``.

    An operator that becomes stateful had no state rows: its declared columns are added
    empty. One that becomes stateless drops its columns only as ``evolution`` says.
    """
    key_problems = tuple(_key_problems(stored_key, declared_key))
    evolution = _implied_rules(evolution or StateEvolution(), stored_state, declared_state)
    old = {f.name: f.type for f in stored_state}
    if evolution.migrate is not None:
        same = [f.name for f in declared_state if f.name in old and same_type(old[f.name], f.type)]
        if len(same) == len(old) == len(declared_state):
            return StateComparison(tuple(_kept(n, old[n]) for n in same), key_problems)
        migrated = ColumnChange("*", Change.MIGRATED, "the whole state, by migrate=")
        return StateComparison((migrated,), key_problems)
    sources = {new: o for o, new in evolution.renamed.items()}
    changes: list[ColumnChange] = []
    used: set[str] = set()
    for declared in declared_state:
        name, kind = declared.name, declared.type
        source = sources.get(name, name) if sources.get(name) in old else name
        if source in old:
            used.add(source)
            changes.append(_from_old(name, source, old[source], kind))
        elif name in evolution.added:
            changes.append(ColumnChange(name, Change.ADDED, f"new, {ddl_type(kind)}"))
        else:
            changes.append(
                ColumnChange(
                    name,
                    Change.REFUSED,
                    f"new column of type {ddl_type(kind)} with no value",
                    fix=f"give it one with StateEvolution(added={{{name!r}: <value or "
                    f"function of the old state>}}), or name the old column it replaces "
                    f"with renamed={{'<old>': {name!r}}}",
                )
            )
    for name, kind in old.items():
        if name in used:
            continue
        if name in evolution.dropped:
            changes.append(ColumnChange(name, Change.DROPPED, f"was {ddl_type(kind)}"))
        else:
            changes.append(
                ColumnChange(
                    name,
                    Change.REFUSED,
                    f"stored column of type {ddl_type(kind)} is not declared",
                    fix=f"drop its values with StateEvolution(dropped=[{name!r}]), or rename "
                    f"it with renamed={{{name!r}: '<new>'}}",
                )
            )
    return StateComparison(tuple(changes), key_problems)


def _implied_rules(
    evolution: StateEvolution, stored: pa.Schema, declared: pa.Schema
) -> StateEvolution:
    """``evolution`` plus what a switch to or from state, or to timers, implies.

    Turning timers on adds ``_timers`` empty: each key's one timeout becomes its one timer.
    """
    marker = [STATELESS_COLUMN]
    if evolution.migrate is not None:
        return evolution
    if TIMERS in declared.names and TIMERS not in stored.names:
        evolution = replace(evolution, added={TIMERS: None, **evolution.added})
    if stored.names == marker and declared.names != marker:  # no rows to fill
        added = {f.name: None for f in declared if f.name not in stored.names}
        dropped = [*evolution.dropped, STATELESS_COLUMN]
        return replace(evolution, added={**added, **evolution.added}, dropped=dropped)
    if declared.names == marker and stored.names != marker:
        return replace(evolution, added={STATELESS_COLUMN: None, **evolution.added})
    return evolution


def _kept(name: str, kind: pa.DataType) -> ColumnChange:
    return ColumnChange(name, Change.KEPT, ddl_type(kind), source=name)


def _from_old(name: str, source: str, old: pa.DataType, new: pa.DataType) -> ColumnChange:
    renamed = f"from {source!r}, " if source != name else ""
    if same_type(old, new):
        if source == name:
            return _kept(name, new)
        return ColumnChange(name, Change.RENAMED, f"{renamed}{ddl_type(new)}", source=source)
    types = f"{renamed}{ddl_type(old)} -> {ddl_type(new)}"
    if widens(old, new):
        return ColumnChange(name, Change.WIDENED, types, source=source)
    return ColumnChange(
        name,
        Change.REFUSED,
        f"{types} is not a widening",
        source=source,
        fix="convert the values with StateEvolution(migrate=<function of the old state "
        f"DataFrame>), or declare a type that widens {ddl_type(old)}",
    )


def _key_problems(stored: pa.Schema, declared: pa.Schema) -> list[str]:
    if stored.names != declared.names:
        return [
            f"stored key columns {stored.names}, declared {declared.names}: state cannot be "
            f"re-keyed in place; read it with Snapshots.state, re-key it with DataFrame code "
            f"and write it to a new root with write_state"
        ]
    return [
        f"key column {f.name!r} is stored as {ddl_type(f.type)}, declared "
        f"{ddl_type(declared.field(f.name).type)}; "
        f"declare the stored type"
        for f in stored
        if not same_type(f.type, declared.field(f.name).type)
    ]


def evolve_rows(
    rows: pa.Table,
    key: Sequence[str],
    comparison: StateComparison,
    declared_state: pa.Schema,
    evolution: StateEvolution,
    operator: str,
) -> pa.Table:
    """The stored state rows with the declared state columns, by the column rules.

    ``rows`` holds the key, the stored state columns and any other columns (kept as they
    are, after the state columns). The comparison must be compatible and not MIGRATED.

    Raises:
        SchemaMismatchError: A function given in ``added`` fails or returns values that do
            not fit the column.
    """
    by_name = {c.column: c for c in comparison.changes if c.change is not Change.DROPPED}
    stored = {c.source for c in comparison.changes if c.source is not None}
    dropped = {c.column for c in comparison.changes if c.change is Change.DROPPED}
    old_state: pd.DataFrame | None = None
    columns: dict[str, Any] = {k: rows[k] for k in key}
    for declared in declared_state:
        change = by_name[declared.name]
        if change.source is not None:
            columns[declared.name] = rows[change.source].cast(declared.type)
            continue
        # absent: a column a switch between stateless and stateful adds empty
        value = evolution.added.get(declared.name)
        if callable(value):
            if old_state is None:
                old_state = to_frame(
                    rows.select([*key, *(n for n in rows.column_names if n in stored | dropped)])
                )
            value = _called(value, old_state, declared.name, operator)
        columns[declared.name] = _column(
            value, declared.type, rows.num_rows, declared.name, operator
        )
    for name in rows.column_names:
        if name not in columns and name not in stored and name not in dropped:
            columns[name] = rows[name]
    evolved = pa.table(columns)
    # a stateless operator keeps no key: switching to one drops every key with its state
    return evolved.slice(0, 0) if declared_state.names == [STATELESS_COLUMN] else evolved


def _called(
    fn: Callable[[pd.DataFrame], Any], state: pd.DataFrame, name: str, operator: str
) -> Any:
    try:
        return fn(state)
    except Exception as err:
        raise SchemaMismatchError(
            f"operator {operator!r}: the function computing new state column {name!r} "
            f"failed: {type(err).__name__}: {err}"
        ) from err


def _column(value: Any, kind: pa.DataType, rows: int, name: str, operator: str) -> Any:
    try:
        if isinstance(value, pd.Series | list) or hasattr(value, "__array__"):
            array = pa.array(value, type=kind, from_pandas=True)
            if len(array) != rows:
                raise ValueError(f"{len(array)} values for {rows} rows")
            return array
        return pa.array([value] * rows, type=kind)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as err:
        raise SchemaMismatchError(
            f"operator {operator!r}: the value of new state column {name!r} does not fit its "
            f"type {kind}: {err}"
        ) from None
