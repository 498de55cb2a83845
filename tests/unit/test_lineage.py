"""How a start maps its checkpoint onto the root's epochs, and the same look without side
effects that a job takes before it starts a stage (generative: random histories of runs,
rollbacks and crashes, on real checkpoint folders)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pyspark_abs.errors import PipelineMismatchError
from pyspark_abs.manifest.entries import EpochStatus
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.protocol.lineage import Lineage, read_lineage, resolve_lineage
from pyspark_abs.protocol.spark_checkpoint import ArrowFiles, CheckpointReader
from pyspark_abs.storage.root import SnapshotRoot
from tests.support.manifest import entry


def checkpoint_folder(path: Path, query_id: str | None, planned: int, committed: int) -> None:
    """A Spark checkpoint as Spark leaves it: its id, offsets and commits of micro-batches."""
    path.mkdir(parents=True)
    if query_id is None:
        return
    (path / "metadata").write_text(json.dumps({"id": query_id}))
    for folder, count in (("offsets", planned), ("commits", committed)):
        (path / folder).mkdir()
        for batch in range(count):
            (path / folder / str(batch)).write_text("v1")


def history(rng: random.Random) -> tuple[EpochLog, dict[str, int], int | None]:
    """Runs of checkpoints q0, q1, ... separated by rollbacks, the last maybe crashed.

    Returns the manifest, the micro-batches each checkpoint's run committed, and the epoch
    of the newest rollback's restore epoch (None: no rollback).
    """
    epochs, runs, restored = EpochLog(), {}, None
    epoch = 0
    for run in range(rng.randint(1, 4)):
        query = f"q{run}"
        batches = rng.randint(0, 3)
        for batch in range(batches):
            for status in (EpochStatus.PREPARED, EpochStatus.COMMITTED):
                epochs.record(entry(epoch, status, query_id=query, batch_id=batch, key_groups=4))
            epoch += 1
        runs[query] = batches
        if rng.random() < 0.6 and epoch:
            origin = f"rollback to {rng.randrange(epoch)}"
            epochs.record(entry(epoch, origin=origin))
            epochs.record(entry(epoch, EpochStatus.RESTORED, origin=origin))
            restored = epoch
            epoch += 1
    return epochs, runs, restored


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path.parent)) for p in path.parent.rglob("*"))


@pytest.mark.parametrize("seed", range(150))
def test_the_look_before_a_start_sees_what_the_start_does_and_moves_nothing(
    seed: int, tmp_path: Path
) -> None:
    rng = random.Random(seed)
    epochs, runs, restored = history(rng)
    query = rng.choice([None, *runs])
    batches = runs.get(query or "", 0)
    committed = batches if rng.random() < 0.8 else rng.randint(0, batches)
    planned = committed + rng.randint(0, 1)
    location = tmp_path / "checkpoint"
    checkpoint_folder(location, query, planned, committed)
    reader = CheckpointReader(str(location), ArrowFiles())
    before = listing(location)
    try:
        looked: Lineage | PipelineMismatchError = read_lineage(epochs, reader, SnapshotRoot("root"))
    except PipelineMismatchError as err:
        looked = err
    assert listing(location) == before, "the look moved or changed the checkpoint"
    try:
        started: Lineage | PipelineMismatchError = resolve_lineage(
            epochs, reader, SnapshotRoot("root")
        )
    except PipelineMismatchError as err:
        started = err
    if isinstance(looked, PipelineMismatchError):
        assert isinstance(started, PipelineMismatchError)
        assert str(started) == str(looked)
        return
    assert started == looked
    assert location.exists() is not looked.superseded, "moved aside exactly when superseded"
    newest = max((e.epoch for e in epochs.entries), default=None)
    if not looked.fresh:  # it continues: its query wrote the root's epochs
        assert query is not None
        assert (looked.superseded, looked.key_groups) == (False, 4)
    if restored is not None and restored == newest and query is not None and planned:
        # a checkpoint that began before the newest restore epoch is never continued
        began = [e.epoch for e in epochs.entries if e.query_id == query]
        if not began or max(began) < restored:
            assert (looked.fresh, looked.superseded) == (True, True)
            assert looked.epoch_base == restored + 1


def test_a_checkpoint_that_began_before_a_rollback_is_superseded_and_moved_only_on_start(
    tmp_path: Path,
) -> None:
    epochs = EpochLog()
    for epoch in range(3):
        epochs.record(entry(epoch, query_id="q0", batch_id=epoch, key_groups=4))
        epochs.record(entry(epoch, EpochStatus.COMMITTED, query_id="q0", batch_id=epoch))
    epochs.record(entry(3, origin="rollback to 1"))
    epochs.record(entry(3, EpochStatus.RESTORED, origin="rollback to 1"))
    location = tmp_path / "checkpoint"
    checkpoint_folder(location, "q0", 3, 3)
    reader = CheckpointReader(str(location), ArrowFiles())
    looked = read_lineage(epochs, reader, SnapshotRoot("root"))
    assert (looked.fresh, looked.superseded, looked.epoch_base) == (True, True, 4)
    assert location.exists()
    assert resolve_lineage(epochs, reader, SnapshotRoot("root")) == looked
    assert not location.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-superseded-by-epoch-3"]
