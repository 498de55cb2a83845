"""Fault injection at named steps of the snapshot protocol.

Tests, demos and chaos runs put :class:`Fault` objects into ``AbsConfig(faults=...)``. When
the protocol reaches a matching step it raises :class:`~pyspark_abs.errors.InjectedFault`,
exits the process as a crash would, stops the process for a supervisor to kill, or damages
what a pre-commit task wrote.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from pyspark_abs.errors import ConfigError, InjectedFault

EXIT_CODE = 86
"""Exit status of a process stopped by a ``FaultAction.EXIT`` fault."""


class FaultStep(str, Enum):
    """Protocol steps where a fault can be injected, in protocol order."""

    PRECOMMIT_TASK = "precommit_task"
    """In a pre-commit task, after its files are written and before it yields its marker."""
    AFTER_ALIGN = "after_align"
    """On the driver, markers aligned and files verified, before PREPARED is recorded."""
    AFTER_PREPARED = "after_prepared"
    """PREPARED is recorded; no table is committed yet."""
    BETWEEN_TABLE_COMMITS = "between_table_commits"
    """The first table of the epoch is committed, the others are not. With a snapshot
    interval, the epoch is the one that closes the group (the others are never committed
    alone)."""
    AFTER_COMMITTED = "after_committed"
    """COMMITTED is recorded; in sync mode the micro-batch has not returned yet. With a
    snapshot interval, the epoch is the one that closes the group."""
    DURING_PUBLISH = "during_publish"
    """A committed snapshot's records are in an open Kafka transaction that is not committed."""
    DURING_COMPACTION = "during_compaction"
    """Compaction wrote the compacted files; the commit replacing the old ones is not made."""
    DURING_VACUUM = "during_vacuum"
    """Vacuum deleted the files of one table; the other tables are not vacuumed yet."""


class FaultAction(str, Enum):
    """What an injected fault does."""

    RAISE = "raise"
    """Raise InjectedFault: the micro-batch (or task) fails like any other error."""
    EXIT = "exit"
    """Leave the process at once with EXIT_CODE, skipping cleanup, as a crash would."""
    PAUSE = "pause"
    """Driver steps only: stop the process (SIGSTOP) at the step. A supervisor that waits
    for the stop (``waitpid`` with ``WUNTRACED``) can then kill it exactly there, or let it
    go on (SIGCONT) and kill it a moment later, e.g. inside the next Delta commit. Start the
    process in its own session: a supervisor running Spark itself may signal its whole
    process group and so continue it early."""
    DROP_MARKER = "drop_marker"
    """Pre-commit task only: write the files but yield no barrier marker."""
    DELETE_FILE = "delete_file"
    """Pre-commit task only: delete the first file after listing it in the marker."""
    TRUNCATE_FILE = "truncate_file"
    """Pre-commit task only: cut the first file short after listing it in the marker."""


_TASK_ONLY = {FaultAction.DROP_MARKER, FaultAction.DELETE_FILE, FaultAction.TRUNCATE_FILE}
_DRIVER_ONLY = {FaultAction.PAUSE}


@dataclass(frozen=True)
class Fault:
    """A fault to inject once at a protocol step.

    Attributes:
        step: Where to inject.
        epoch: Only in this epoch; None means the first epoch that reaches the step.
        action: What to do there.
        partition: For ``PRECOMMIT_TASK``, only in this partition (None: any partition).
        attempt: For ``PRECOMMIT_TASK``, only in this task attempt, so Spark's retry of the
            task succeeds (None: every attempt, so the task keeps failing).
    """

    step: FaultStep
    epoch: int | None = None
    action: FaultAction = FaultAction.RAISE
    partition: int | None = None
    attempt: int | None = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "step", FaultStep(self.step))
        object.__setattr__(self, "action", FaultAction(self.action))
        if self.action in _TASK_ONLY and self.step is not FaultStep.PRECOMMIT_TASK:
            raise ConfigError(
                f"fault action {self.action.value!r} applies only to step "
                f"{FaultStep.PRECOMMIT_TASK.value!r}, not {self.step.value!r}"
            )
        if self.action in _DRIVER_ONLY and self.step is FaultStep.PRECOMMIT_TASK:
            raise ConfigError(
                f"fault action {self.action.value!r} stops the driver process and applies only "
                f"to driver steps, not {self.step.value!r}"
            )

    def matches(
        self, step: FaultStep, epoch: int, partition: int | None = None, attempt: int = 0
    ) -> bool:
        """Whether this fault applies at the given step, epoch, partition and attempt."""
        if step is not self.step or (self.epoch is not None and self.epoch != epoch):
            return False
        if step is not FaultStep.PRECOMMIT_TASK:
            return True
        return (self.partition is None or self.partition == partition) and (
            self.attempt is None or self.attempt == attempt
        )


def crash_or_raise(fault: Fault, where: str) -> None:
    """Carry out a RAISE, EXIT or PAUSE fault; other actions are left to the caller."""
    if fault.action is FaultAction.EXIT:
        os._exit(EXIT_CODE)
    if fault.action is FaultAction.PAUSE:
        # Sent to the process, the stop may be taken by another thread while this one runs on
        # past the step (seen: a zombie passing its lease check before it stopped); sent to
        # this thread, it takes effect before the call returns.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
    if fault.action is FaultAction.RAISE:
        raise InjectedFault(f"injected fault at {where}")


def task_fault(faults: Sequence[Fault], epoch: int, partition: int, attempt: int) -> Fault | None:
    """The fault to inject in a pre-commit task, if any.

    Task faults fire by attempt number rather than once per process, because a task's retry
    runs in a fresh task context.
    """
    for fault in faults:
        if fault.matches(FaultStep.PRECOMMIT_TASK, epoch, partition, attempt):
            return fault
    return None


class FaultInjector:
    """Driver-side injector: each fault fires at most once per injector."""

    def __init__(self, faults: Sequence[Fault]) -> None:
        self._pending = [f for f in faults if f.step is not FaultStep.PRECOMMIT_TASK]
        self._lock = threading.Lock()

    def at(self, step: FaultStep, epoch: int) -> None:
        """Inject the first pending fault that matches this step and epoch."""
        with self._lock:
            fault = next((f for f in self._pending if f.matches(step, epoch)), None)
            if fault is None:
                return
            self._pending.remove(fault)
        crash_or_raise(fault, f"step {step.value!r} of epoch {epoch}")
