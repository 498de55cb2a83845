"""Live-state markers and the rebuild plan, checked against a model of which epochs changed
a key group (generative: random histories of touches, snapshot intervals, commit lag and
replays)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_abs.errors import StateEncodingError
from pyspark_abs.manifest.entries import EpochStatus
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.state_codec import decode_marker, encode_marker
from pyspark_abs.protocol.live_state import LocalLiveState, rebuild_steps
from pyspark_abs.protocol.local_folders import mark_used, operator_home
from tests.support.key_groups import word_plan
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


@pytest.mark.parametrize("seed", range(60))
def test_local_files_follow_the_committed_markers_through_retries_and_zombies(
    seed: int, tmp_path: Path
) -> None:
    """Spark's side modelled directly: every attempt of a micro-batch reads the marker
    committed for the previous version; failed attempts and zombies write files whose
    markers are never committed, before or after the attempt that commits. Every committed
    marker must read back exactly the state written with it, in a file holding nothing else,
    and stale files must not pile up."""
    rng = random.Random(seed)
    plan = word_plan(lambda rows, state, ctx: None)
    live = LocalLiveState.for_root("/root", "r", "state/wc", "/root/state", str(tmp_path), 0, "run")
    folder = tmp_path / "pyspark-abs-state" / live.root_key / "wc" / "kg-5"
    committed: list[bytes | None] = [None]  # the marker of each state-store version
    written: dict[bytes, tuple[dict[str, int], int]] = {}  # each marker's state and bytes
    for batch in range(rng.randint(3, 25)):
        previous = committed[-1]
        if rng.random() < 0.25:  # the key group did not change: the marker stays
            committed.append(previous)
            continue
        attempts = []
        for _attempt in range(rng.randint(1, 3)):
            if previous is not None:
                loaded = live.load(plan, 5, previous, batch)
                pairs = zip(loaded["word"].to_pylist(), loaded["count"].to_pylist(), strict=True)
                assert dict(pairs) == written[previous][0]
            counts = {
                f"w{rng.randint(0, 30)}": rng.randint(1, 99) for _ in range(rng.randint(1, 6))
            }
            state = pa.table(
                {
                    "word": list(counts),
                    "count": list(counts.values()),
                    "_timeout": [None] * len(counts),
                }
            ).cast(plan.blob_schema)
            marker = live.save(plan, 5, state, batch, previous)
            frame = plan.state_codec.frame_parts(plan.state_codec.message(state), compress=False)
            written[marker] = (counts, sum(len(part) for part in frame))
            attempts.append(marker)
        winner = rng.choice(attempts)
        committed.append(winner)
        files = {p.name: p.stat().st_size for p in folder.iterdir()}
        assert files[f"{batch:012d}-{winner[12:].hex()}.abs"] == written[winner][1]
        kept = -1 if previous is None else int.from_bytes(previous[4:12], "little")
        assert all(int(name.split("-")[0]) >= kept for name in files), files
        assert len(files) <= 2 * 3, files  # this batch's attempts and the replaced one's


def word_state(plan: OperatorPlan, counts: dict[str, int]) -> pa.Table:
    return pa.table(
        {"word": list(counts), "count": list(counts.values()), "_timeout": [None] * len(counts)}
    ).cast(plan.blob_schema)


def test_a_root_copied_as_a_directory_never_shares_the_originals_files(tmp_path: Path) -> None:
    """Same root id (the copy's manifest is the original's), other location, same host."""
    plan = word_plan(lambda rows, state, ctx: None)
    folder = str(tmp_path)
    original = LocalLiveState.for_root("/d/prod", "id", "state/wc", "/d/prod/s", folder, 0, "a")
    copy = LocalLiveState.for_root("/d/copy", "id", "state/wc", "/d/copy/s", folder, 0, "b")
    assert original.root_key != copy.root_key
    marker = copy.save(plan, 5, word_state(plan, {"bee": 1}), 3, None)
    loaded = copy.load(plan, 5, marker, 4)  # memory-mapped
    first = original.save(plan, 5, word_state(plan, {"ant": 7}), 7, None)
    original.save(plan, 5, word_state(plan, {"ant": 8}), 8, first)
    assert loaded.to_pydict()["word"] == ["bee"]
    assert copy.load(plan, 5, marker, 4).to_pydict()["count"] == [1]


def test_a_save_overwrites_only_files_its_own_run_wrote(tmp_path: Path) -> None:
    """A stale file of an earlier run may still be mapped by that run's task: deleted, not
    overwritten. A stale file of this run is recycled (renamed and overwritten)."""
    plan = word_plan(lambda rows, state, ctx: None)

    def run(name: str) -> LocalLiveState:
        return LocalLiveState.for_root("/r", "id", "state/wc", "/r/s", str(tmp_path), 0, name)

    old, new = run("old"), run("new")
    at3 = old.save(plan, 5, word_state(plan, {"a": 3}), 3, None)
    at5 = old.save(plan, 5, word_state(plan, {"a": 5}), 5, at3)
    mapped = old.load(plan, 5, at3, 4)
    folder = tmp_path / "pyspark-abs-state" / new.root_key / "wc" / "kg-5"
    stale = {p.name: p.stat().st_ino for p in folder.iterdir()}
    at7 = new.save(plan, 5, word_state(plan, {"a": 7, "b": 1}), 7, at5)
    assert mapped.to_pydict() == {"word": ["a"], "count": [3], "_timeout": [None]}
    inodes = {p.name: p.stat().st_ino for p in folder.iterdir()}
    assert len(inodes) == 2
    assert not set(inodes.values()) & {stale[n] for n in stale if n[:12] < "000000000005"}
    # the new run's own stale file is the one recycled
    at9 = new.save(plan, 5, word_state(plan, {"a": 9}), 9, at7)
    seventh = next(p.stat().st_ino for p in folder.iterdir() if p.name.startswith("000000000007"))
    new.save(plan, 5, word_state(plan, {"a": 11}), 11, at9)
    eleventh = {p.stat().st_ino for p in folder.iterdir() if p.name.startswith("000000000011")}
    assert eleventh == {seventh}
    assert len(list(folder.iterdir())) == 2
    assert new.load(plan, 5, at9, 10).to_pydict()["count"] == [9]


def test_root_folders_nobody_used_for_a_week_are_removed(tmp_path: Path) -> None:
    top = tmp_path / "pyspark-abs-state"
    week = 7 * 24 * 3600
    stale, stamped, fresh = top / "gone", top / "stamped", top / "fresh"
    for folder in (stale, stamped, fresh):
        (folder / "op" / "kg-1").mkdir(parents=True)
    old = time.time() - week - 60
    os.utime(stale, (old, old))
    os.utime(stamped, (old, old))
    (stamped / ".used").touch()  # an older folder that a run still uses
    home = operator_home(str(tmp_path), "mine", "op")
    assert home == str(top / "mine" / "op")
    assert sorted(p.name for p in top.iterdir()) == ["fresh", "stamped"]
    mark_used(home)
    assert (top / "mine" / ".used").exists()
