"""Job snapshots: which epochs form one consistent cut over every stage (no I/O).

Every stage of a job numbers its epochs like its upstream stages (a channel is read one
upstream epoch per micro-batch), so epoch ``n`` of every stage is one consistent cut: each
stage's state and outputs at ``n`` came from exactly its upstream stages' outputs up to
``n``. Job snapshot ``n`` exists once every stage can be read as of ``n``.

A stage can be read as of ``n`` when ``n`` is one of its snapshots, or when ``n`` was idle in
it (a no-data micro-batch that changed nothing, which is not recorded): then its newest
epoch before ``n``, if that is a snapshot, holds the same state and outputs. An unrecorded
``n`` counts as idle only when the stage's next recorded epoch is a micro-batch: a job
rollback gives every stage a restore epoch after the newest epoch of any stage, so the
numbers it skips in a stage were never run there, and at them the stages are no cut.

A stage that started reading after a job rollback reads the upstream epochs the rollback
took back as empty (they are not on the timeline it continues): its epochs there are
*detached*, no cut with its upstream stages' epochs of the same number.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StageEpochs:
    """What a stage's manifest says about its epochs.

    Attributes:
        stage: The stage's name.
        recorded: Epochs with a PREPARED entry (micro-batch or restore epochs).
        snapshots: Epochs that are readable snapshots (COMMITTED or RESTORED).
        restores: Restore epochs.
        detached: Epochs that read upstream epochs a job rollback took back, as empty.
    """

    stage: str
    recorded: frozenset[int]
    snapshots: frozenset[int]
    restores: frozenset[int] = frozenset()
    detached: frozenset[int] = frozenset()

    @classmethod
    def of(
        cls,
        stage: str,
        recorded: Iterable[int],
        snapshots: Iterable[int],
        restores: Iterable[int] = (),
        detached: Iterable[int] = (),
    ) -> StageEpochs:
        """The epochs of ``stage``."""
        return cls(
            stage,
            frozenset(recorded),
            frozenset(snapshots),
            frozenset(restores),
            frozenset(detached),
        )

    def epoch_for(self, epoch: int) -> int | None:
        """The stage epoch whose snapshot is the stage as of job epoch ``epoch``, or None."""
        if epoch in self.detached:
            return None
        if epoch in self.snapshots:
            return epoch
        if epoch in self.recorded:
            return None
        after = min((e for e in self.recorded if e > epoch), default=None)
        if after is None or after in self.restores:
            return None
        before = max((e for e in self.recorded if e < epoch), default=None)
        return before if before in self.snapshots - self.detached else None


@dataclass(frozen=True)
class JobSnapshot:
    """One consistent cut of a job: every stage's snapshot as of job epoch ``epoch``.

    Attributes:
        epoch: The job epoch.
        stages: Each stage's epoch whose snapshot it reads: ``epoch`` itself, or an earlier
            one when ``epoch`` was idle in the stage.
    """

    epoch: int
    stages: Mapping[str, int]


def job_snapshots(stages: Sequence[StageEpochs]) -> list[JobSnapshot]:
    """The job snapshots, oldest first: the epochs every stage can be read as of."""
    candidates = sorted(set().union(*(s.snapshots for s in stages))) if stages else []
    found = []
    for epoch in candidates:
        cut = {s.stage: s.epoch_for(epoch) for s in stages}
        if all(e is not None for e in cut.values()):
            found.append(JobSnapshot(epoch, {k: v for k, v in cut.items() if v is not None}))
    return found
