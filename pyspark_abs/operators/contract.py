"""The operator contract: what a user writes.

An operator is one key-group function, ``fn(rows, state, ctx) -> KeyGroupResult``, run once
per shuffle partition and epoch over all rows and all state of the partition's key groups that
have rows or a due timeout
(:func:`vectorized_operator`; :func:`arrow_operator` is the same contract on ``pyarrow``
tables instead of pandas frames). The per-key form, ``fn(key, rows, state) -> rows`` with a
:class:`KeyState` much like Spark's ``GroupState`` (:func:`operator`), is an adapter that
produces such a function (:mod:`pyspark_abs.operators.per_key`). Only keys whose state
changed are written to the snapshot.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import (
    TYPE_CHECKING,
    Generic,
    NotRequired,
    Required,
    TypeAlias,
    TypedDict,
    TypeVar,
    Unpack,
)

import pandas as pd
import pyarrow as pa

from pyspark_abs.errors import OperatorDefinitionError
from pyspark_abs.operators.evolution import StateEvolution
from pyspark_abs.operators.schema import RESERVED_COLUMNS, STATELESS_COLUMN, SchemaLike

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

DEFAULT_OUTPUT = "output"
"""Name of the output of an operator declared with ``output_schema=``."""

STATELESS = f"{STATELESS_COLUMN} boolean"
"""The state schema of an operator declared without one: a column it never writes."""


class TimeoutMode(str, Enum):
    """Which clock a key's timeout follows."""

    NONE = "none"
    PROCESSING_TIME = "processing_time"
    EVENT_TIME = "event_time"


KeyGroupFunction: TypeAlias = (
    "Callable[[pd.DataFrame, pd.DataFrame, KeyGroupContext], KeyGroupResult | None]"
)
ArrowKeyGroupFunction: TypeAlias = (
    "Callable[[pa.Table, pa.Table, ArrowContext], KeyGroupResult | None]"
)
AnyKeyGroupFunction: TypeAlias = "Callable[..., KeyGroupResult | None]"
"""A :data:`KeyGroupFunction` or an :data:`ArrowKeyGroupFunction` (see ``Operator.arrow``)."""
Rows: TypeAlias = "pd.DataFrame | pa.Table"
"""Rows a function returns: a pandas frame or a ``pyarrow.Table``, whatever form it was given."""
InputCheck: TypeAlias = "Callable[[StructType, str | None], str | None]"
"""See :attr:`Operator.input_problem`."""


@dataclass(frozen=True)
class Clock:
    """The two clocks of an epoch, in milliseconds since the Unix epoch.

    Attributes:
        processing_time_ms: The micro-batch's timestamp; the same when a batch is replayed.
        watermark_ms: The event-time watermark, or None if the query has none.
    """

    processing_time_ms: int
    watermark_ms: int | None


Keys = TypeVar("Keys", pd.DataFrame, pa.Table)


@dataclass(frozen=True)
class _Context(Generic[Keys]):
    """What a key-group function knows about its call.

    Attributes:
        operator: The operator's name.
        epoch: The epoch (micro-batch id) being processed, if known.
        key_group: The key group being processed.
        clock: Processing time and watermark of the epoch.
        timed_out: Key columns of the keys whose timeout fired in this call. They have no
            rows in this call.
        time_zone: The session time zone: instants arrive as datetimes aware of it, and
            naive datetimes returned are wall-clock times there.
        outputs: The declared outputs and their column names, in declaration order.
        key_groups: All key groups the call serves, when it serves several (then
            ``key_group`` is the first of them); empty when it serves ``key_group`` alone.
    """

    operator: str
    epoch: int | None
    key_group: int
    clock: Clock
    timed_out: Keys
    time_zone: str = "UTC"
    outputs: tuple[tuple[str, tuple[str, ...]], ...] = ()
    key_groups: tuple[int, ...] = ()

    @property
    def where(self) -> str:
        """The call's place, as error messages name it."""
        return place(self.operator, self.epoch, self.key_groups or (self.key_group,))


class KeyGroupContext(_Context[pd.DataFrame]):
    """The call of a :func:`vectorized_operator`'s function; ``timed_out`` is a frame."""


class ArrowContext(_Context[pa.Table]):
    """The call of an :func:`arrow_operator`'s function; ``timed_out`` is a ``pyarrow.Table``."""


def place(operator: str, epoch: int | None, key_groups: int | Sequence[int]) -> str:
    """A call of one or several key groups, as error messages name it."""
    if isinstance(key_groups, int):
        key_groups = (key_groups,)
    if len(key_groups) == 1:
        return f"operator {operator!r}, epoch {epoch}, key group {key_groups[0]}"
    named = ", ".join(str(k) for k in key_groups[:_NAMED])
    if len(key_groups) > _NAMED:
        named += f" and {len(key_groups) - _NAMED} more"
    return f"operator {operator!r}, epoch {epoch}, key groups {named}"


_NAMED = 6
"""Key groups an error message names before it counts the rest."""


@dataclass
class KeyGroupResult:
    """What a key-group function returns for one key group.

    Each part is a pandas frame or a ``pyarrow.Table``, whichever form the operator works in
    (either is taken from any operator).

    Attributes:
        state: New state of the keys that changed: key columns, state columns and
            optionally ``_timeout`` (ms since the Unix epoch; missing or null means no
            timeout). Keys not listed keep their state. Returning unchanged keys is allowed
            but they are not written to the snapshot.
        removed: Key columns of the keys whose state is removed.
        output: Output rows: rows for an operator with one output, or a dict from output
            name to rows.
    """

    state: Rows | None = None
    removed: Rows | None = None
    output: Rows | Mapping[str, Rows] | None = None


class OperatorOptions(TypedDict):
    """The declaration every operator decorator takes, as keyword arguments.

    :func:`operator`, :func:`vectorized_operator` and :func:`arrow_operator` (and the window
    operators, which fill some in themselves) take these; a dict of them can be kept and
    passed on whole (``@vectorized_operator(**options)``)::

        counting: OperatorOptions = {"key": "word", "state_schema": "count long",
                                     "output_schema": "word string, count long"}

    Keys:
        key: Key column name(s).
        state_schema: Columns of a key's state. Leave it out for a stateless operator (a
            filter, a parser, a bronze stage): its state table stays empty, and it may not
            return state, have timeouts or a ttl.
        output_schema: Schema of the single output, named ``"output"``.
        outputs: Several named outputs with their schemas (instead of ``output_schema``).
        timeout: ``"none"`` (the default), ``"processing_time"`` or ``"event_time"``.
        name: Operator id; defaults to the function's name. It names the state table, so
            keep it when the function is renamed.
        evolution: How state stored by an earlier version of the operator becomes
            ``state_schema``; the next start migrates it once (see :class:`StateEvolution`).
        ttl: State time-to-live: a key whose state the function has not written for
            longer is removed (a tombstone in the snapshot of the epoch in which it expires,
            and the function no longer sees it). Each write starts the key's clock again.
        ttl_clock: ``"processing_time"`` (the default: the micro-batch's time) or
            ``"event_time"`` (the key's newest event when it was written, against the
            watermark).
    """

    key: Required[str | Sequence[str]]
    state_schema: NotRequired[SchemaLike | None]
    output_schema: NotRequired[SchemaLike | None]
    outputs: NotRequired[Mapping[str, SchemaLike] | None]
    timeout: NotRequired[TimeoutMode | str]
    name: NotRequired[str | None]
    evolution: NotRequired[StateEvolution | None]
    ttl: NotRequired[dt.timedelta | None]
    ttl_clock: NotRequired[TimeoutMode | str]


@dataclass(frozen=True)
class Operator:
    """A declared stateful operator, built with :func:`operator` or :func:`vectorized_operator`.

    Attributes:
        name: Operator id; its state table is ``state/<name>`` under the snapshot root.
        key: Key column names in the input rows.
        state_schema: Columns of one key's state (:data:`STATELESS` for an operator
            declared without state).
        outputs: Output names and their schemas, in declaration order.
        function: The key-group function; for an operator declared per key, the adapter
            around the per-key function.
        arrow: The function takes ``pyarrow`` tables (:func:`arrow_operator`), not frames.
        timeout: The clock key timeouts follow; with ``ttl_ms``, the clock of the TTL.
        evolution: How state stored by an earlier version becomes ``state_schema``.
        ttl_ms: State time-to-live: a key whose state was not written for longer is
            removed. Its expiry is kept as the key's ``_timeout``.
        input_problem: For operators that read more of the input than their key (the ready
            window operators): given the source's schema and the column its watermark is
            on (None: none), what does not fit, or None. A pipeline refuses a source with
            a problem before anything runs.
    """

    name: str
    key: tuple[str, ...]
    state_schema: SchemaLike
    outputs: tuple[tuple[str, SchemaLike], ...]
    function: AnyKeyGroupFunction = field(repr=False)
    timeout: TimeoutMode = TimeoutMode.NONE
    evolution: StateEvolution | None = None
    ttl_ms: int | None = None
    arrow: bool = False
    input_problem: InputCheck | None = field(default=None, repr=False, compare=False)

    @property
    def output_names(self) -> tuple[str, ...]:
        """Names of the operator's outputs."""
        return tuple(name for name, _ in self.outputs)

    @property
    def stateless(self) -> bool:
        """Whether the operator was declared without state (no ``state_schema``)."""
        return self.state_schema == STATELESS


def vectorized_operator(
    **options: Unpack[OperatorOptions],
) -> Callable[[KeyGroupFunction], Operator]:
    """Declare a vectorized operator: ``fn(rows, state, ctx) -> KeyGroupResult``.

    The function gets every row of one key group in this epoch, the current state of every
    key of the group (key columns, state columns and ``_timeout``), and a
    :class:`KeyGroupContext`. It returns a :class:`KeyGroupResult`.

    Example::

        @vectorized_operator(key="word", state_schema="count long",
                             output_schema="word string, count long")
        def word_count(rows, state, ctx):
            counts = rows.groupby("word").size().rename("n").reset_index()
            merged = counts.merge(state, on="word", how="left")
            merged["count"] = merged["count"].fillna(0).astype("int64") + merged["n"]
            new = merged[["word", "count"]]
            return KeyGroupResult(state=new, output=new)

    Args:
        options: The declaration: ``key`` and the schemas, clocks, name and evolution
            (see :class:`OperatorOptions`).

    Raises:
        OperatorDefinitionError: The declaration is inconsistent.
    """
    return lambda fn: declare(fn, options)


def arrow_operator(
    **options: Unpack[OperatorOptions],
) -> Callable[[ArrowKeyGroupFunction], Operator]:
    """Declare a vectorized operator on ``pyarrow`` tables: ``fn(rows, state, ctx)``.

    The contract of :func:`vectorized_operator`, without pandas: ``rows`` (this epoch's
    rows of the key group, with the source's schema), ``state`` (every key of the group:
    key columns, state columns and ``_timeout``) and ``ctx.timed_out`` are
    ``pyarrow.Table`` objects, and the :class:`KeyGroupResult` returned holds tables (frames
    are taken too). Returned columns are cast to the declared types (a failed cast is a
    :class:`~pyspark_abs.errors.SchemaMismatchError`); values go through as they are, so a
    NaN stays NaN, as in Spark's ``applyInArrow``. Naive timestamps returned for a
    ``timestamp`` column are wall-clock times in the session time zone, as in the pandas form;
    instants arrive tagged with the session time zone, as in Spark's ``applyInArrow``.

    Example::

        @arrow_operator(key="word", state_schema="count long",
                        output_schema="word string, count long")
        def word_count(rows, state, ctx):
            seen = rows.group_by("word").aggregate([("word", "count")])
            ...
            return KeyGroupResult(state=counts, output=counts)

    The arguments are those of :func:`vectorized_operator` (see :class:`OperatorOptions`).

    Raises:
        OperatorDefinitionError: The declaration is inconsistent.
    """
    return lambda fn: declare(fn, options, arrow=True)


def declare(fn: AnyKeyGroupFunction, options: OperatorOptions, *, arrow: bool = False) -> Operator:
    """Check a declaration and build its :class:`Operator` (see :class:`OperatorOptions`).

    ``arrow``: the function takes ``pyarrow`` tables (see :func:`arrow_operator`).

    Raises:
        OperatorDefinitionError: The declaration is inconsistent.
    """
    name = options.get("name")
    unknown = sorted(set(options) - set(OperatorOptions.__annotations__))
    if unknown:
        raise OperatorDefinitionError(
            f"operator {name or getattr(fn, '__name__', '')!r}: unknown option(s) {unknown}; "
            f"an operator takes {list(OperatorOptions.__annotations__)}"
        )
    if "key" not in options:
        raise OperatorDefinitionError(
            f"operator {name or getattr(fn, '__name__', '')!r}: key= is missing; name the key "
            f'column(s), e.g. key="word"'
        )
    key = options["key"]
    state_schema = options.get("state_schema")
    output_schema = options.get("output_schema")
    outputs = options.get("outputs")
    timeout = options.get("timeout", TimeoutMode.NONE)
    evolution = options.get("evolution")
    ttl = options.get("ttl")
    ttl_clock = options.get("ttl_clock", TimeoutMode.PROCESSING_TIME)
    op_name = name or getattr(fn, "__name__", "")
    if not callable(fn):
        raise OperatorDefinitionError(f"operator {op_name!r}: expected a function, got {fn!r}")
    if not op_name or not op_name.replace("_", "").replace("-", "").isalnum():
        raise OperatorDefinitionError(
            f"operator name {op_name!r} must be non-empty and use only letters, digits, '_' "
            f"and '-' (it names the state table)"
        )
    keys = (key,) if isinstance(key, str) else tuple(key)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise OperatorDefinitionError(
            f"operator {op_name!r}: key must be a column name or a list of them, got {key!r}"
        )
    if len(set(keys)) != len(keys):
        raise OperatorDefinitionError(f"operator {op_name!r}: key columns repeat in {keys}")
    reserved = [k for k in keys if k in RESERVED_COLUMNS]
    if reserved:
        raise OperatorDefinitionError(
            f"operator {op_name!r}: key column(s) {reserved} use names reserved for the state "
            f"table {list(RESERVED_COLUMNS)}; rename them"
        )
    if (output_schema is None) == (outputs is None):
        raise OperatorDefinitionError(
            f"operator {op_name!r}: declare exactly one of output_schema= (one output) or "
            f"outputs= (several named outputs)"
        )
    declared = (
        ((DEFAULT_OUTPUT, output_schema),)
        if output_schema is not None
        else tuple((outputs or {}).items())
    )
    if not declared:
        raise OperatorDefinitionError(f"operator {op_name!r}: outputs= is empty")
    for out_name, _ in declared:
        if not isinstance(out_name, str) or not out_name:
            raise OperatorDefinitionError(
                f"operator {op_name!r}: output names must be non-empty strings, got {out_name!r}"
            )
    try:
        mode = TimeoutMode(timeout)
    except ValueError:
        raise OperatorDefinitionError(
            f"operator {op_name!r}: timeout must be one of "
            f"{[m.value for m in TimeoutMode]}, got {timeout!r}"
        ) from None
    ttl_ms = None
    if ttl is not None:
        mode, ttl_ms = _ttl(op_name, ttl, ttl_clock, mode)
    if evolution is not None and not isinstance(evolution, StateEvolution):
        raise OperatorDefinitionError(
            f"operator {op_name!r}: evolution= must be a StateEvolution, got "
            f"{type(evolution).__name__}"
        )
    if state_schema is None and mode is not TimeoutMode.NONE:
        raise OperatorDefinitionError(
            f"operator {op_name!r} is stateless (no state_schema), so it can have no "
            f"timeouts or ttl; declare the state_schema it keeps"
        )
    if state_schema is None and evolution is not None and evolution.migrate is not None:
        raise OperatorDefinitionError(
            f"operator {op_name!r} is stateless (no state_schema): its evolution= can only "
            f"drop the state of an earlier stateful version, with StateEvolution(dropped=[...])"
        )
    return Operator(
        name=op_name,
        key=keys,
        state_schema=STATELESS if state_schema is None else state_schema,
        outputs=declared,
        function=fn,
        timeout=mode,
        evolution=evolution,
        ttl_ms=ttl_ms,
        arrow=arrow,
    )


def _ttl(
    name: str, ttl: dt.timedelta, clock: TimeoutMode | str, timeout: TimeoutMode
) -> tuple[TimeoutMode, int]:
    """The clock and milliseconds of a declared TTL."""
    if not isinstance(ttl, dt.timedelta) or ttl <= dt.timedelta(0):
        raise OperatorDefinitionError(
            f"operator {name!r}: ttl must be a positive datetime.timedelta, got {ttl!r}"
        )
    if timeout is not TimeoutMode.NONE:
        raise OperatorDefinitionError(
            f"operator {name!r}: ttl= keeps each key's expiry as its timeout, so it cannot be "
            f"combined with timeout={timeout.value!r}; drop one of them"
        )
    modes = (TimeoutMode.PROCESSING_TIME, TimeoutMode.EVENT_TIME)
    if clock not in modes:
        raise OperatorDefinitionError(
            f"operator {name!r}: ttl_clock must be one of {[m.value for m in modes]}, got {clock!r}"
        )
    return TimeoutMode(clock), ttl // dt.timedelta(milliseconds=1)
