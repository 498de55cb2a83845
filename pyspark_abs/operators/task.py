"""Running an operator on one key group in one epoch.

:func:`run_key_group` is the pure part: given the key group's rows, its current state and the
epoch's clocks, it fires expired timeouts, calls the user's function, checks what it
returned, and computes the key group's new state, the changed keys (upserts and tombstones)
and the outputs. :class:`KeyGroupTask` is the thin adapter Spark calls through
``applyInPandasWithState``; it keeps the key group's state as one blob in Spark's state store
and emits the envelope.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_abs.errors import (
    AbsError,
    OperatorError,
)
from pyspark_abs.operators.arrow_files import read_parquet
from pyspark_abs.operators.contract import (
    Clock,
    TimeoutMode,
)
from pyspark_abs.operators.envelope import envelope_frame
from pyspark_abs.operators.key_group import run_key_group, run_key_groups
from pyspark_abs.operators.keys import BoolArray, contains, key_arrays
from pyspark_abs.operators.plan import DecidedReplay, OperatorPlan
from pyspark_abs.operators.schema import (
    DELETED,
    KEY_GROUP,
    RESTORE,
    SLOT_COLUMN,
    exact_columns,
    instant_columns,
    localize,
)
from pyspark_abs.operators.state_codec import SlotEntry, decode_slot, encode_slot
from pyspark_abs.operators.state_diff import (
    apply_changes_keeping,
    earliest_timeout,
)
from pyspark_abs.operators.timers import clock_now
from pyspark_abs.runtime import settle_worker_heap

if TYPE_CHECKING:
    from pyspark.sql.streaming.state import GroupState


def current_epoch() -> int | None:
    """The epoch (micro-batch id) of the running Spark task, if it is a streaming task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    value = context.getLocalProperty("streaming.sql.batchId") if context else None
    return int(value) if value is not None else None


class KeyGroupTask:
    """The function Spark's ``applyInPandasWithState`` calls once per group and epoch.

    A group is one key group, or with ``plan.slots`` a slot: every key group whose number
    is the slot's modulo ``plan.slots``, all served by one call of the function.
    """

    def __init__(self, plan: OperatorPlan) -> None:
        self.plan = plan

    def __call__(
        self, key: tuple[Any, ...], frames: Iterator[pd.DataFrame], group_state: GroupState
    ) -> Iterator[pd.DataFrame]:
        """Run the group's key groups and yield their envelope rows."""
        settle_worker_heap()
        plan = self.plan
        batch_id = current_epoch()
        chunks = [f for f in frames if len(f)]
        if chunks:
            rows = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
            rows = plan.without_late_rows(exact_columns(rows), batch_id)
            if not plan.arrow:  # the Arrow form takes the microseconds as they are
                inputs = [c for c in plan.input_instants if c in rows.columns]
                rows = localize(rows, inputs, plan.time_zone)
        else:
            rows = plan.frame(plan.input_schema.empty_table())
        clock = Clock(
            group_state.getCurrentProcessingTimeMs(), plan.watermark(_watermark(group_state))
        )
        if plan.slots is None:
            stored: bytes | None = group_state.get[0] if group_state.exists else None
            kept, timeout_ms, envelope = _step(
                plan, int(key[0]), _without(rows, KEY_GROUP, SLOT_COLUMN), stored, clock, batch_id
            )
            if kept is None:
                if group_state.exists:
                    group_state.remove()
            elif kept is not stored:
                group_state.update((kept,))
            _set_timeout(plan, group_state, timeout_ms, clock)
            if envelope is not None:
                yield envelope
            return
        entries = decode_slot(group_state.get[0]) if group_state.exists else {}
        envelopes = _slot(plan, entries, rows, clock, batch_id)
        if entries:
            group_state.update((encode_slot(entries),))
        elif group_state.exists:
            group_state.remove()
        timeouts = [e.timeout_ms for e in entries.values() if e.timeout_ms is not None]
        _set_timeout(plan, group_state, min(timeouts, default=None), clock)
        if envelopes:
            yield envelopes[0] if len(envelopes) == 1 else pd.concat(envelopes, ignore_index=True)


def _slot(
    plan: OperatorPlan,
    entries: dict[int, SlotEntry],
    rows: pd.DataFrame,
    clock: Clock,
    batch_id: int | None,
) -> list[pd.DataFrame]:
    """Run the key groups of a slot that have rows or a due timeout; update ``entries``.

    Returns their envelope rows.
    """
    now = clock_now(plan.timeout, clock)
    row_groups = np.asarray(rows[KEY_GROUP], dtype=np.int64) if len(rows) else _NO_GROUPS
    due = {
        k
        for k, e in entries.items()
        if e.timeout_ms is not None and now is not None and e.timeout_ms <= now
    }
    key_groups = sorted(due.union(np.unique(row_groups).tolist()))
    if not key_groups:
        return []
    if RESTORE in rows.columns or plan.replay_of(batch_id) is not None:
        # the first micro-batch after a restore, or a replay: key group by key group
        envelopes = []
        for key_group in key_groups:
            entry = entries.pop(key_group, None)
            mine = rows[row_groups == key_group] if len(rows) else rows
            value, timeout_ms, envelope = _step(
                plan,
                key_group,
                _without(mine, KEY_GROUP, SLOT_COLUMN).reset_index(drop=True),
                None if entry is None else entry.stored,
                clock,
                batch_id,
            )
            if value is not None:
                entries[key_group] = SlotEntry(value, timeout_ms)
            if envelope is not None:
                envelopes.append(envelope)
        return envelopes
    stored = [entries[k].stored if k in entries else None for k in key_groups]
    states = [
        plan.blob_schema.empty_table()
        if value is None
        else plan.live_state.load(plan, key_group, value, batch_id)
        for key_group, value in zip(key_groups, stored, strict=True)
    ]
    outputs, outcomes = run_key_groups(
        plan,
        key_groups,
        [s.num_rows for s in states],
        _without(rows, KEY_GROUP, SLOT_COLUMN),
        row_groups,
        pa.concat_tables(states) if len(states) > 1 else states[0],
        clock,
        batch_id,
    )
    envelopes = []
    for key_group, value, outcome in zip(key_groups, stored, outcomes, strict=True):
        kept: bytes | None = value
        if not outcome.state.num_rows:
            kept = None
        elif outcome.changes.num_rows:
            known = outcome.kept
            kept = plan.live_state.save(plan, key_group, outcome.state, batch_id, value, known)
        if kept is None:
            entries.pop(key_group, None)
        else:
            entries[key_group] = SlotEntry(kept, outcome.next_timeout_ms)
        if plan.snapshots and outcome.changes.num_rows:
            changes = (outcome.changes, plan.change_codec.encode(outcome.changes))
            envelopes.append(envelope_frame(key_group, changes, outcome.keys_delta, []))
    written = _encoded(plan, outputs)
    if written:
        envelopes.append(envelope_frame(key_groups[0], None, 0, written))
    return envelopes


_NO_GROUPS = np.zeros(0, dtype=np.int64)


def _step(
    plan: OperatorPlan,
    key_group: int,
    rows: pd.DataFrame,
    stored: bytes | None,
    clock: Clock,
    batch_id: int | None,
) -> tuple[bytes | None, int | None, pd.DataFrame | None]:
    """Run one key group alone.

    Args:
        plan: The operator.
        key_group: The key group.
        rows: Its rows (without the key-group column).
        stored: What Spark's state store keeps for it (None: no state).
        clock: The epoch's clocks.
        batch_id: The micro-batch.

    Returns:
        What the state store keeps for it now (``stored`` itself when unchanged, None: no
        state), its earliest timeout, and its envelope rows, if any.
    """
    restored, regrouped = None, None
    if RESTORE in rows.columns:
        restored, regrouped, rows = _split_restore(plan, rows, key_group, stored is not None)
    if restored is not None:
        state = restored
    elif stored is not None:
        state = plan.live_state.load(plan, key_group, stored, batch_id)
    else:
        state = plan.blob_schema.empty_table()
    replay = plan.replay_of(batch_id)
    if replay is not None:
        replaced = stored if restored is None else None  # the state read is not replaced's
        return _install_decided(plan, replay, key_group, state, replaced)
    if restored is not None and not len(rows):
        # Only restore rows: install the key group's state; the function runs on data.
        installed = plan.live_state.save(plan, key_group, state, batch_id, None, None)
        moved = _with_regrouped(plan, plan.change_schema.empty_table(), restored, regrouped)
        envelope = None
        if plan.snapshots and moved.num_rows:
            envelope = envelope_frame(key_group, (moved, plan.change_codec.encode(moved)), 0, [])
        return installed, earliest_timeout(state), envelope
    outcome = run_key_group(plan, key_group, rows, state, clock, batch_id)

    kept: bytes | None = stored
    if not outcome.state.num_rows:
        kept = None
    elif outcome.changes.num_rows or restored is not None:
        known = outcome.kept if restored is None else None
        kept = plan.live_state.save(plan, key_group, outcome.state, batch_id, stored, known)

    changes = None
    changed = _with_regrouped(plan, outcome.changes, restored, regrouped)
    if plan.snapshots and changed.num_rows:
        changes = (changed, plan.change_codec.encode(changed))
    outputs = _encoded(plan, outcome.outputs)
    envelope = None
    if changes is not None or outputs:
        envelope = envelope_frame(key_group, changes, outcome.keys_delta, outputs)
    return kept, outcome.next_timeout_ms, envelope


def _encoded(
    plan: OperatorPlan, outputs: tuple[pa.Table, ...]
) -> list[tuple[int, pa.Table, bytes]]:
    """The outputs with rows, each with its index and encoded payload."""
    return [
        (i, table, plan.output_codecs[i].encode(table))
        for i, table in enumerate(outputs)
        if table.num_rows
    ]


def _install_decided(
    plan: OperatorPlan,
    replay: DecidedReplay,
    key_group: int,
    state: pa.Table,
    stored: bytes | None,
) -> tuple[bytes | None, int | None, pd.DataFrame | None]:
    """Give the key group the state its decided epoch committed, not a recomputed one.

    ``stored`` is the value Spark's state store kept for ``state`` (None: none, or ``state``
    is not what it holds). Returns as :func:`_step` does; the envelope names the key group
    when it had decided changes, so that the coordinator can tell every changed key group
    was reached.
    """
    changes = epoch_changes(plan, replay.epoch, replay.files, key_group)
    installed, kept = apply_changes_keeping(plan, state, changes)
    value = None
    if installed.num_rows:
        value = plan.live_state.save(plan, key_group, installed, replay.batch_id, stored, kept)
    envelope = envelope_frame(key_group, (changes, b""), 0, []) if changes.num_rows else None
    return value, earliest_timeout(installed), envelope


_CHANGES: dict[tuple[str, ...], pa.Table] = {}
"""The state changes of the decided epoch read last, read once per Python worker."""


def epoch_changes(
    plan: OperatorPlan, epoch: int, files: tuple[str, ...], key_group: int
) -> pa.Table:
    """The state changes (change schema) decided epoch ``epoch`` made to ``key_group``.

    Args:
        plan: The operator.
        epoch: The decided epoch, for messages.
        files: The epoch's pre-committed state-change files (absolute locations).
        key_group: The key group.

    Raises:
        OperatorError: The epoch's files cannot be read (e.g. vacuumed).
    """
    changes = _CHANGES.get(files)
    if changes is None:
        columns = [*plan.change_schema.names, KEY_GROUP]
        try:
            changes = (
                read_parquet(list(files), columns)
                if files
                else plan.change_schema.append(pa.field(KEY_GROUP, pa.int32())).empty_table()
            )
        except (OSError, pa.ArrowException) as err:
            raise OperatorError(
                f"operator {plan.name!r}: epoch {epoch} is decided, but its state changes "
                f"cannot be read ({err}). Roll back to the newest intact snapshot with "
                f"pyspark_abs.rollback and start again"
            ) from err
        _CHANGES.clear()
        _CHANGES[files] = changes
    mine = pc.equal(changes[KEY_GROUP], pa.scalar(key_group, pa.int32()))
    return changes.filter(mine).select(plan.change_schema.names).cast(plan.change_schema)


def _without(frame: pd.DataFrame, *columns: str) -> pd.DataFrame:
    """``frame`` without ``columns``, sharing the other columns (``drop`` copies them)."""
    return pd.DataFrame({c: frame[c] for c in frame.columns if c not in columns}, copy=False)


def _split_restore(
    plan: OperatorPlan, rows: pd.DataFrame, key_group: int, has_state: bool
) -> tuple[pa.Table | None, BoolArray | None, pd.DataFrame]:
    """Separate restore rows (a restored key's state) from data rows.

    Returns the restored state, which of its keys the snapshot holds in another key group
    (it was taken with another key-group count), and the data rows.
    """
    is_restore = rows[RESTORE].notna().to_numpy()
    data = rows[~is_restore].drop(columns=[RESTORE]).reset_index(drop=True)
    if not is_restore.any():
        return None, None, data
    if has_state:
        raise AbsError(
            f"operator {plan.name!r}, epoch {current_epoch()}, key group {key_group}: restore "
            f"rows arrived for a key group that already has state; restore epochs are applied "
            f"only in the first micro-batch of a new checkpoint"
        )
    picked = rows[is_restore]
    values = pd.DataFrame(picked[RESTORE].tolist(), index=picked.index, dtype=object)
    held_in = values.pop(KEY_GROUP)
    regrouped = (held_in.isna() | (held_in != key_group)).to_numpy(dtype=bool)
    values = localize(values, instant_columns(plan.state_schema), plan.time_zone)
    frame = pd.concat([picked[list(plan.key_columns)], values], axis=1)
    what = f"restored state of key group {key_group}"
    return plan.to_arrow(frame, plan.blob_schema, what), regrouped, data


def _with_regrouped(
    plan: OperatorPlan, changes: pa.Table, restored: pa.Table | None, regrouped: BoolArray | None
) -> pa.Table:
    """``changes`` plus an unchanged row for each restored key held in another key group.

    After a restore at another key-group count, the state table holds such a key under its
    old key group until it changes; live state rebuilt from the snapshot (a new cluster)
    looks keys up by key group, so the first epoch writes each of them again in its new one.
    """
    if restored is None or regrouped is None or not regrouped.any():
        return changes
    moved = restored.filter(pa.array(regrouped))
    if changes.num_rows:
        moved_keys, changed_keys = key_arrays([moved, changes], plan.key_columns)
        moved = moved.filter(pa.array(~contains(moved_keys, changed_keys)))
    live = pa.array(np.zeros(moved.num_rows, dtype=bool))
    return pa.concat_tables([changes, moved.append_column(DELETED, live).cast(plan.change_schema)])


def _set_timeout(
    plan: OperatorPlan, group_state: GroupState, timeout_ms: int | None, clock: Clock
) -> None:
    """Ask Spark to call the key group again when its earliest timeout is due."""
    if timeout_ms is None:
        return
    if plan.timeout is TimeoutMode.EVENT_TIME:
        # Spark calls once the watermark has passed the timestamp; timers are due once it
        # has reached theirs. Spark takes no timestamp at or below 0, or below the watermark.
        due = timeout_ms - 1 if plan.has_timers else timeout_ms
        group_state.setTimeoutTimestamp(max(due, 1, clock.watermark_ms or 0))
    elif plan.timeout is TimeoutMode.PROCESSING_TIME:
        group_state.setTimeoutDuration(max(1, timeout_ms - clock.processing_time_ms))


def _watermark(group_state: GroupState) -> int | None:
    try:
        return int(group_state.getCurrentWatermarkMs())
    except Exception:
        return None
