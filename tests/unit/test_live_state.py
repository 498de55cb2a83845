"""Live-state markers and the rebuild plan, checked against a model of which epochs changed
a key group (generative: random histories of touches, snapshot intervals, commit lag and
replays)."""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pyspark_abs.config import AbsConfig
from pyspark_abs.errors import StateEncodingError, StateTooLargeError
from pyspark_abs.manifest.entries import EpochStatus
from pyspark_abs.manifest.log import EpochLog
from pyspark_abs.operators.keys import BoolArray
from pyspark_abs.operators.plan import OperatorPlan
from pyspark_abs.operators.state_codec import Marker, decode_marker, encode_marker
from pyspark_abs.protocol import live_state, state_chain
from pyspark_abs.protocol.live_state import LocalLiveState, rebuild_steps
from pyspark_abs.protocol.local_folders import mark_used, operator_home
from pyspark_abs.protocol.state_chain import MAX_DEPTH, extends_chain, read_chain
from pyspark_abs.storage.root import SnapshotRoot
from tests.support.key_groups import word_plan
from tests.support.manifest import entry

TABLE = "state/op"
SHARE = AbsConfig().local_state_change_share


def test_a_marker_names_its_epoch_and_token_and_a_blob_is_no_marker() -> None:
    token = bytes(range(16))
    marker = Marker(12_345_678_901, token, 12_345_678_800, 7, 81_234, 9_876_543)
    assert decode_marker(encode_marker(marker)) == marker
    old = b"ABSL" + (41).to_bytes(8, "little") + token  # written before change files
    assert decode_marker(old) == Marker(41, token, 41)
    assert decode_marker(b"ABS2" + bytes(40)) is None
    with pytest.raises(StateEncodingError, match=r"marker .* has 9 bytes, not 28"):
        decode_marker(b"ABSL" + bytes(5))
    with pytest.raises(StateEncodingError, match=r"marker .* has 28 bytes, not 60"):
        decode_marker(b"ABSM" + bytes(24))


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
    live = LocalLiveState.for_root(
        SnapshotRoot("/root"), "r", "state/wc", "/root/state", str(tmp_path), 0, "run", SHARE
    )
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
            marker = live.save(plan, 5, state, batch, previous, None)
            frame = plan.state_codec.frame_parts(plan.state_codec.message(state), compress=False)
            written[marker] = (counts, sum(len(part) for part in frame))
            attempts.append(marker)
        winner = rng.choice(attempts)
        committed.append(winner)
        files = {p.name: p.stat().st_size for p in folder.iterdir()}
        assert files[f"{batch:012d}-{winner[12:28].hex()}.abs"] == written[winner][1]
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
    original = LocalLiveState.for_root(
        SnapshotRoot("/d/prod"), "id", "state/wc", "/d/prod/s", folder, 0, "a", SHARE
    )
    copy = LocalLiveState.for_root(
        SnapshotRoot("/d/copy"), "id", "state/wc", "/d/copy/s", folder, 0, "b", SHARE
    )
    assert original.root_key != copy.root_key
    marker = copy.save(plan, 5, word_state(plan, {"bee": 1}), 3, None, None)
    loaded = copy.load(plan, 5, marker, 4)  # memory-mapped
    first = original.save(plan, 5, word_state(plan, {"ant": 7}), 7, None, None)
    original.save(plan, 5, word_state(plan, {"ant": 8}), 8, first, None)
    assert loaded.to_pydict()["word"] == ["bee"]
    assert copy.load(plan, 5, marker, 4).to_pydict()["count"] == [1]


def test_a_save_overwrites_only_files_its_own_run_wrote(tmp_path: Path) -> None:
    """A stale file of an earlier run may still be mapped by that run's task: deleted, not
    overwritten. A stale file of this run is recycled (renamed and overwritten)."""
    plan = word_plan(lambda rows, state, ctx: None)

    def run(name: str) -> LocalLiveState:
        return LocalLiveState.for_root(
            SnapshotRoot("/r"), "id", "state/wc", "/r/s", str(tmp_path), 0, name, SHARE
        )

    old, new = run("old"), run("new")
    at3 = old.save(plan, 5, word_state(plan, {"a": 3}), 3, None, None)
    at5 = old.save(plan, 5, word_state(plan, {"a": 5}), 5, at3, None)
    mapped = old.load(plan, 5, at3, 4)
    folder = tmp_path / "pyspark-abs-state" / new.root_key / "wc" / "kg-5"
    stale = {p.name: p.stat().st_ino for p in folder.iterdir()}
    at7 = new.save(plan, 5, word_state(plan, {"a": 7, "b": 1}), 7, at5, None)
    assert mapped.to_pydict() == {"word": ["a"], "count": [3], "_timeout": [None]}
    inodes = {p.name: p.stat().st_ino for p in folder.iterdir()}
    assert len(inodes) == 2
    assert not set(inodes.values()) & {stale[n] for n in stale if n[:12] < "000000000005"}
    # the new run's own stale file is the one recycled
    at9 = new.save(plan, 5, word_state(plan, {"a": 9}), 9, at7, None)
    seventh = next(p.stat().st_ino for p in folder.iterdir() if p.name.startswith("000000000007"))
    new.save(plan, 5, word_state(plan, {"a": 11}), 11, at9, None)
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


def next_state(
    plan: OperatorPlan, loaded: pa.Table, after: dict[str, int]
) -> tuple[pa.Table, BoolArray]:
    """The state ``after`` as an operator returns it: the rows of ``loaded`` it keeps, in
    their order, then the new rows; and the mask of kept rows."""
    words, counts = loaded["word"].to_pylist(), loaded["count"].to_pylist()
    kept: BoolArray = np.array(
        [after.get(str(w)) == c for w, c in zip(words, counts, strict=True)], dtype=bool
    )
    old = {w for w, k in zip(words, kept, strict=True) if k}
    new = {w: c for w, c in after.items() if w not in old}
    rows = loaded.filter(pa.array(kept)).to_pydict()
    return word_state(plan, dict(zip(rows["word"], rows["count"], strict=True)) | new), kept


@pytest.mark.parametrize("seed", range(80))
def test_change_files_read_back_every_committed_state_through_retries_and_zombies(
    seed: int, tmp_path: Path
) -> None:
    """As above, with the operator's kept rows given, so that saves go on chains of change
    files: every committed marker reads back its state (a dict model), chains form and end,
    a save that does not know which rows it kept writes the whole state, and no
    file older than the chain replaced stays."""
    rng = random.Random(seed)
    plan = word_plan(lambda rows, state, ctx: None)
    live = LocalLiveState.for_root(
        SnapshotRoot("/root"), "r", "state/wc", "/root/state", str(tmp_path), 0, "run", SHARE
    )
    folder = tmp_path / "pyspark-abs-state" / live.root_key / "wc" / "kg-5"
    committed: list[bytes | None] = [None]
    written: dict[bytes | None, dict[str, int]] = {None: {}}
    loaded = word_state(plan, {})
    for batch in range(rng.randint(3, 40)):
        previous = committed[-1]
        if rng.random() < 0.2:
            committed.append(previous)
            continue
        attempts = []
        for _attempt in range(rng.randint(1, 3)):
            before = written[previous]
            read = previous is not None and rng.random() < 0.85
            if read:
                assert previous is not None
                loaded = live.load(plan, 5, previous, batch)
                pairs = zip(loaded["word"].to_pylist(), loaded["count"].to_pylist(), strict=True)
                assert dict(pairs) == before
            after = dict(before) if before else {f"w{i}": i for i in range(rng.randint(400, 900))}
            for _ in range(rng.randint(1, 12)):
                word = f"w{rng.randint(0, 1000)}"
                if word in after and rng.random() < 0.3:
                    del after[word]
                else:
                    after[word] = rng.randint(1, 10**6)
            state, kept = (
                next_state(plan, loaded, after) if read else (word_state(plan, after), None)
            )
            marker = live.save(plan, 5, state, batch, previous, kept)
            written[marker] = after
            attempts.append(marker)
            chain, new = decode_marker(previous or b""), decode_marker(marker)
            assert new is not None
            if read and chain is not None and chain.depth == 0 and chain.base_bytes > 6_000:
                assert new.depth == 1, "a small change to a whole file read wrote it all again"
        winner = rng.choice(attempts)
        committed.append(winner)
        replaced = decode_marker(previous or b"")
        kept_from = replaced.base_epoch if replaced is not None else -1
        assert all(int(p.name.split("-")[0]) >= kept_from for p in folder.iterdir())
    final = committed[-1]
    if final is not None:
        assert len(live.load(plan, 5, final, 99)) == len(written[final])


@pytest.mark.parametrize("share", [SHARE, 1.0])
@pytest.mark.parametrize("change_bytes", [40, 1_000, 30_000, 200_000])
def test_a_chain_bounds_the_bytes_written_per_change_and_the_bytes_read(
    change_bytes: int, share: float
) -> None:
    """Saves of ``change_bytes`` each, every epoch, in 16 key groups of 3 MB: the bytes
    written per save stay within (1/share + 2) change files or a whole file per
    MAX_DEPTH - 7 saves, a read never sees more than ``share`` of the whole file in change
    files, and key groups with long chains do not all write their whole state in one
    epoch. Share 0 writes the whole state every time."""
    base, saves, groups = 3_000_000, 1_000, 16
    markers = [Marker(0, bytes(16), 0, base_bytes=base)] * groups
    total, whole_per_epoch = 0, []
    for epoch in range(1, saves + 1):
        whole = 0
        for group, marker in enumerate(markers):
            assert not extends_chain(marker, change_bytes, group, 0.0)
            if extends_chain(marker, change_bytes, group, share):
                chain = marker.chain_bytes + change_bytes
                marker = Marker(epoch, bytes(16), marker.base_epoch, marker.depth + 1, chain, base)
                total += change_bytes
            else:
                marker = Marker(epoch, bytes(16), epoch, base_bytes=base)
                total += base
                whole += 1
            assert marker.chain_bytes <= base * share
            assert marker.depth <= MAX_DEPTH
            markers[group] = marker
        whole_per_epoch.append(whole)
    per_save = total / saves / groups
    bound = max(change_bytes * (1 / share + 2), change_bytes + base / (MAX_DEPTH - 7))
    assert per_save <= bound * 1.05
    if change_bytes > base * share:
        assert per_save == base  # no chain pays: every save writes the whole state
    elif base * share >= 20 * change_bytes:  # chains long enough to end apart
        assert max(whole_per_epoch) < groups, "every key group wrote its whole state at once"


def test_markers_handed_back_as_bytearrays_go_on_chains(tmp_path: Path) -> None:
    """Spark 4.0's state store hands values back as bytearrays, not bytes."""
    plan = word_plan(lambda rows, state, ctx: None)
    live = LocalLiveState.for_root(
        SnapshotRoot("/r"), "id", "state/wc", "/r/s", str(tmp_path), 0, "run", SHARE
    )
    counts = {f"w{i}": i for i in range(500)}
    whole = bytearray(live.save(plan, 5, word_state(plan, counts), 1, None, None))
    loaded = live.load(plan, 5, whole, 2)  # type: ignore[arg-type]
    state, kept = next_state(plan, loaded, counts | {"w1": 99})
    chained = live.save(plan, 5, state, 2, whole, kept)  # type: ignore[arg-type]
    marker = decode_marker(chained)
    assert marker is not None
    assert marker.depth == 1
    again = live.load(plan, 5, bytearray(chained), 3)  # type: ignore[arg-type]
    assert dict(zip(again["word"].to_pylist(), again["count"].to_pylist(), strict=True)) == (
        counts | {"w1": 99}
    )


@pytest.mark.parametrize("lose", ["deleted", "written again"])
def test_a_change_file_this_worker_parsed_before_is_still_checked_on_disk(
    lose: str, tmp_path: Path
) -> None:
    """A worker keeps the change files it parsed, but a chain read again still sees a
    change file that was lost or written again since, and refuses the chain."""
    plan = word_plan(lambda rows, state, ctx: None)
    live = LocalLiveState.for_root(
        SnapshotRoot("/r"), "id", "state/wc", "/r/s", str(tmp_path), 0, "run", SHARE
    )
    counts = {f"w{i}": i for i in range(500)}
    markers = [live.save(plan, 5, word_state(plan, counts), 1, None, None)]
    for batch in range(2, 5):
        loaded = live.load(plan, 5, markers[-1], batch)
        counts |= {f"w{batch}": -batch}
        state, kept = next_state(plan, loaded, counts)
        markers.append(live.save(plan, 5, state, batch, markers[-1], kept))
    newest = decode_marker(markers[-1])
    assert newest is not None
    assert newest.depth == 3

    def path_of(m: Marker) -> str:
        return live._file(plan, 5, m)

    read, _ = read_chain(plan, newest, path_of)
    assert dict(zip(read["word"].to_pylist(), read["count"].to_pylist(), strict=True)) == counts
    middle = decode_marker(markers[2])
    assert middle is not None
    if lose == "deleted":
        os.unlink(path_of(middle))
        with pytest.raises(FileNotFoundError):
            read_chain(plan, newest, path_of)
    else:
        data = Path(path_of(middle)).read_bytes()
        os.unlink(path_of(middle))
        Path(path_of(middle)).write_bytes(data)
        with pytest.raises(StateEncodingError, match="written again"):
            read_chain(plan, newest, path_of)


def test_chains_read_in_a_cycle_larger_than_the_cache_still_find_parsed_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker reads its key groups' chains in the same order every epoch. With parsed
    change files of twice the cache's bytes, forgetting the oldest first would parse every
    file again on every read; the cache must keep serving some, and stay within its bytes."""
    plan = word_plan(lambda rows, state, ctx: None)
    live = LocalLiveState.for_root(
        SnapshotRoot("/r"), "id", "state/wc", "/r/s", str(tmp_path), 0, "run", SHARE
    )
    newest = {}
    for key_group in range(12):
        counts = {f"w{i}": i for i in range(400)}
        marker = live.save(plan, key_group, word_state(plan, counts), 1, None, None)
        for batch in range(2, 5):
            loaded = live.load(plan, key_group, marker, batch)
            counts |= {f"w{batch}": -batch, f"n{key_group}-{batch}": batch}
            state, kept = next_state(plan, loaded, counts)
            marker = live.save(plan, key_group, state, batch, marker, kept)
        newest[key_group] = decode_marker(marker)
    parsed: list[int] = []
    parse = state_chain._link

    def counted(plan: OperatorPlan, at: Marker, data: pa.Buffer, own: bytes) -> Any:
        parsed.append(at.epoch)
        return parse(plan, at, data, own)

    def read_all() -> None:
        for key_group, marker in newest.items():
            assert marker is not None
            assert marker.depth == 3
            read_chain(plan, marker, functools.partial(live._file, plan, key_group))

    monkeypatch.setattr(state_chain, "_link", counted)
    unbounded = state_chain._ParsedLinks(1 << 40)
    monkeypatch.setattr(state_chain, "_LINKS", unbounded)
    read_all()
    files = len(parsed)
    assert files == 3 * len(newest)
    cache = state_chain._ParsedLinks(unbounded.held // 2)
    monkeypatch.setattr(state_chain, "_LINKS", cache)
    parsed.clear()
    for _ in range(4):
        read_all()
        assert cache.held <= cache.limit
    assert len(parsed) < 4 * files * 0.9, f"{len(parsed)} of {4 * files} reads parsed again"


@pytest.mark.parametrize("slack", [-1, 0])
def test_a_state_is_measured_alike_whether_written_whole_or_on_a_chain(
    slack: int, tmp_path: Path
) -> None:
    """A state at the bound passes and one byte over it fails, written whole and on a
    chain alike: whether an epoch fails must not depend on how a retry writes it."""
    plan = word_plan(lambda rows, state, ctx: None)
    live = LocalLiveState.for_root(
        SnapshotRoot("/r"), "id", "state/wc", "/r/s", str(tmp_path), 0, "run", SHARE
    )
    counts = {f"w{i}": i for i in range(500)}
    first = live.save(plan, 5, word_state(plan, counts), 1, None, None)
    state, kept = next_state(plan, live.load(plan, 5, first, 2), counts | {"w1": 99})
    bounded = dataclasses.replace(plan, max_state_bytes=state.nbytes + slack)
    for known in (None, kept):  # whole, then on the chain
        if slack < 0:
            with pytest.raises(StateTooLargeError, match="above max_key_group_state_bytes"):
                live.save(bounded, 5, state, 2, first, known)
        else:
            depth = decode_marker(live.save(bounded, 5, state, 2, first, known))
            assert depth is not None
            assert depth.depth == (0 if known is None else 1)


def test_the_split_uses_every_core_for_arrow_and_gives_the_worker_its_cap_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PySpark caps a worker's Arrow threads at spark.task.cpus; the split lifts the cap while
    it runs, and puts it back also when the split fails."""
    monkeypatch.setattr(live_state, "usable_cores", lambda: 3)
    previous = pa.cpu_count()
    pa.set_cpu_count(1)
    try:
        with live_state._every_core():
            assert pa.cpu_count() == 3
        assert pa.cpu_count() == 1
        with pytest.raises(OSError, match="disk full"), live_state._every_core():
            raise OSError("disk full")
        assert pa.cpu_count() == 1
    finally:
        pa.set_cpu_count(previous)
