"""Live-state markers and the rebuild plan, checked against a model of which epochs changed
a key group (generative: random histories of touches, snapshot intervals, commit lag and
replays)."""

from __future__ import annotations

import random

import pytest

from pyspark_abs.errors import StateEncodingError
from pyspark_abs.manifest.entries import EpochStatus
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.operators.state_codec import decode_marker, encode_marker
from pyspark_abs.protocol.live_state import rebuild_steps
from tests.support.manifest import entry

TABLE = "state/op"


def test_a_marker_names_its_epoch_and_token_and_a_blob_is_no_marker() -> None:
    token = bytes(range(16))
    assert decode_marker(encode_marker(12_345_678_901, token)) == (12_345_678_901, token)
    assert decode_marker(b"ABS2" + bytes(40)) is None
    with pytest.raises(StateEncodingError, match=r"marker .* has 9 bytes, not 28"):
        decode_marker(b"ABSL" + bytes(5))


def history(rng: random.Random) -> tuple[EpochLog, int, set[int]]:
    """A random manifest of decided epochs, the running micro-batch's epoch, and the epochs
    that changed the key group (none between the marker and the running epoch)."""
    decided = rng.randint(1, 14)
    running = rng.randint(1, decided) if rng.random() < 0.4 else decided  # a replay or not
    touched = {e for e in range(running) if rng.random() < 0.4}
    interval = rng.randint(1, 4)
    committed_upto = rng.randint(-1, decided - 1)  # the async committer's lag
    epochs = EpochLog()
    start = -1
    for epoch in range(decided):
        epochs.record(entry(epoch, tables={TABLE: "uri"}))
        closes = epoch - start >= interval
        if closes and epoch <= committed_upto:
            versions = {TABLE: epoch + 1}
            epochs.record(entry(epoch, EpochStatus.COMMITTED, table_versions=versions))
            for merged in range(start + 1, epoch):
                epochs.record(entry(merged, EpochStatus.MERGED, snapshot_epoch=epoch))
            start = epoch
    return epochs, running, touched


@pytest.mark.parametrize("seed", range(200))
def test_a_rebuild_applies_exactly_the_changes_up_to_the_marker(seed: int) -> None:
    rng = random.Random(seed)
    epochs, running, touched = history(rng)
    if not touched:
        return
    marker = max(touched)
    steps = rebuild_steps(epochs, TABLE, marker, running)
    base = -1 if steps.base is None else steps.base.epoch
    assert base < running, "no snapshot of the running or a later (replayed) epoch"
    applied = {e for e in touched if e <= base} | {c.epoch for c in steps.changes} & touched
    assert applied == {e for e in touched if e <= marker}
    assert [c.epoch for c in steps.changes] == sorted(c.epoch for c in steps.changes)
    assert all(base < c.epoch <= marker for c in steps.changes)
