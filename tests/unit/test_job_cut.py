"""Job snapshots (pure): every listed cut is consistent, against a simulated job."""

from __future__ import annotations

import itertools
import random

import pytest

from pyspark_abs.job_ledger.cut import StageEpochs, job_snapshots


class _Stage:
    """One stage of the simulation: what its manifest records, and its true state per epoch."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.recorded: set[int] = set()
        self.snapshots: dict[int, int] = {}  # stage epoch -> state token
        self.restores: set[int] = set()
        self.truth: dict[int, int] = {}  # job epoch the stage passed through -> state token
        self.token = 0

    def epochs(self) -> StageEpochs:
        return StageEpochs.of(self.name, self.recorded, self.snapshots, self.restores)

    def restore(self, epoch: int, to: int) -> None:
        self.recorded.add(epoch)
        self.restores.add(epoch)
        self.token = self.truth[to]
        self.snapshots[epoch] = self.truth[epoch] = self.token


@pytest.mark.parametrize("seed", range(60))
def test_every_listed_job_snapshot_is_a_consistent_cut_and_none_is_missed(seed: int) -> None:
    rng = random.Random(seed)
    stages = [_Stage(f"s{i}") for i in range(rng.randint(1, 4))]
    tokens = itertools.count(1)
    epoch = 0
    for _ in range(rng.randint(1, 25)):
        move = rng.random()
        shared = [n for n in range(epoch) if all(n in s.snapshots and n in s.truth for s in stages)]
        if move < 0.1 and shared:  # a job rollback: every stage, one restore epoch
            target = rng.choice(shared)
            for stage in stages:
                stage.restore(epoch, target)
            epoch += 1
            continue
        if move < 0.15 and shared:  # one stage alone, then the job rollback it forces
            alone = rng.choice(stages)
            alone.restore(epoch, rng.choice(shared))
            epoch += 1 + rng.randint(0, 2)  # it may run on; the others refuse to read it
            target = rng.choice(shared)
            for stage in stages:
                stage.restore(epoch, target)
            epoch += 1
            continue
        for stage in stages:  # a micro-batch epoch, run by every stage
            if rng.random() < 0.2:  # idle: not recorded, the state is unchanged
                stage.truth[epoch] = stage.token
                continue
            stage.token = next(tokens)
            stage.recorded.add(epoch)
            stage.truth[epoch] = stage.token
            if rng.random() < 0.7:  # else MERGED into a later snapshot: not readable alone
                stage.snapshots[epoch] = stage.token
        epoch += 1
    listed = job_snapshots([s.epochs() for s in stages])
    for snapshot in listed:
        for stage in stages:
            at = snapshot.stages[stage.name]
            assert snapshot.epoch in stage.truth, f"{stage.name} never ran {snapshot.epoch}"
            assert stage.snapshots[at] == stage.truth[snapshot.epoch], (
                f"job snapshot {snapshot.epoch} reads {stage.name} at {at}, which is not its "
                f"state as of {snapshot.epoch}"
            )
    everywhere = set.intersection(*(set(s.snapshots) for s in stages))
    assert everywhere <= {s.epoch for s in listed}
    assert [s.epoch for s in listed] == sorted(s.epoch for s in listed)


def test_an_idle_epoch_reads_the_snapshot_before_it() -> None:
    head = StageEpochs.of("bronze", [0, 2], [0, 2])
    tail = StageEpochs.of("silver", [0, 1, 2], [0, 1, 2])
    assert [(s.epoch, dict(s.stages)) for s in job_snapshots([head, tail])] == [
        (0, {"bronze": 0, "silver": 0}),
        (1, {"bronze": 0, "silver": 1}),
        (2, {"bronze": 2, "silver": 2}),
    ]
    assert job_snapshots([StageEpochs.of("a", [0, 1], [1]), tail])[0].epoch == 1


def test_epochs_a_stage_read_as_taken_back_are_no_cut() -> None:
    """tally joined after a job rollback to 1 (restore epoch 4): it read 2 and 3 as empty."""
    bronze = StageEpochs.of("bronze", [0, 1, 2, 4, 5], [0, 1, 2, 4, 5], [4])
    tally = StageEpochs.of("tally", [0, 1, 2, 4, 5], [0, 1, 2, 4, 5], detached=[2, 3])
    assert [s.epoch for s in job_snapshots([bronze, tally])] == [0, 1, 4, 5]
    idle = StageEpochs.of("tally", [0, 1, 2, 5], [0, 1, 2, 5], detached=[2])
    assert tally.epoch_for(3) is None
    assert idle.epoch_for(3) is None, "an idle epoch after a detached one is no cut either"
