"""Savepoint names in the epoch log: what may be named, untagged, expired, and how loading folds."""

import datetime as dt
import random
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from pyspark_abs.errors import ConfigError, ManifestError, SnapshotNotFoundError
from pyspark_abs.manifest.entries import EpochStatus
from pyspark_abs.manifest.log import EpochLog, is_tag_name
from pyspark_abs.manifest.table import open_manifest
from pyspark_abs.protocol.epoch_writer import EpochWriter
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.retention import expire
from pyspark_abs.upkeep.tags import tag, untag
from tests.support.inputs import race
from tests.support.manifest import T0, entry
from tests.support.roots import PIPELINE, committed_root, prepared

TAGGED, UNTAGGED = EpochStatus.TAGGED, EpochStatus.UNTAGGED


def committed_log(*epochs: int) -> EpochLog:
    """A log in which each of ``epochs`` was PREPARED and COMMITTED."""
    log = EpochLog()
    for epoch in epochs:
        log.record(entry(epoch))
        log.record(entry(epoch, EpochStatus.COMMITTED))
    return log


def at(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def test_a_name_follows_tags_and_untags_and_resolves() -> None:
    log = committed_log(0, 1, 2)
    log.record(entry(1, TAGGED, tag="v1"))
    log.record(entry(2, TAGGED, tag="v2"))
    assert log.tags() == {"v1": 1, "v2": 2}
    assert log.tags_of(1) == ["v1"]
    assert log.resolve("v2", SnapshotRoot("root")) == 2
    assert log.resolve(0, SnapshotRoot("root")) == 0
    log.record(entry(1, UNTAGGED, tag="v1"))
    assert log.tags() == {"v2": 2}
    with pytest.raises(
        SnapshotNotFoundError,
        match=r"no savepoint of snapshot root /r is named 'v1'; the names are 'v2'",
    ):
        log.resolve("v1", SnapshotRoot("/r"))


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (entry(0, TAGGED, tag="v1"), r"'v1' already names the snapshot of epoch 1"),
        (entry(2, TAGGED, tag="v2"), r"epoch 2 is PREPARED; only a COMMITTED or RESTORED"),
        (entry(9, TAGGED, tag="v2"), r"epoch 9 is not in the manifest"),
        (entry(0, TAGGED, tag="2fast"), r"'2fast' cannot name a snapshot"),
        (entry(0, UNTAGGED, tag="v1"), r"'v1' names epoch 1, not epoch 0; nothing to untag"),
        (entry(0, UNTAGGED, tag="v9"), r"'v9' names no snapshot, not epoch 0"),
    ],
)
def test_bad_names_are_refused(row: object, message: str) -> None:
    log = committed_log(0, 1)
    log.record(entry(1, TAGGED, tag="v1"))
    log.record(entry(2))
    with pytest.raises(ManifestError, match=message):
        log.record(row)  # type: ignore[arg-type]
    assert log.tags() == {"v1": 1}


def test_a_named_snapshot_cannot_expire_until_untagged() -> None:
    log = committed_log(0, 1)
    log.record(entry(0, TAGGED, tag="keep"))
    with pytest.raises(ManifestError, match=r"epoch 0 is the named savepoint 'keep'"):
        log.record(entry(0, EpochStatus.EXPIRED))
    log.record(entry(0, UNTAGGED, tag="keep"))
    log.record(entry(0, EpochStatus.EXPIRED))
    assert log.status(0) is EpochStatus.EXPIRED


def test_a_move_is_checked_in_order() -> None:
    log = committed_log(0, 1)
    log.record(entry(0, TAGGED, tag="prod"))
    move = [entry(0, UNTAGGED, tag="prod"), entry(1, TAGGED, tag="prod")]
    with pytest.raises(ManifestError, match="already names"):
        log.check_all(list(reversed(move)))
    log.check_all(move)
    assert log.tags() == {"prod": 0}, "checking changes nothing"


def test_loading_folds_names_in_recorded_order_whatever_the_row_order() -> None:
    rows = [
        entry(0),
        entry(0, EpochStatus.COMMITTED),
        entry(1),
        entry(1, EpochStatus.COMMITTED),
        entry(0, TAGGED, tag="x", recorded_at=at(1)),
        entry(0, UNTAGGED, tag="x", recorded_at=at(2)),
        entry(1, TAGGED, tag="x", recorded_at=at(3)),
        entry(0, EpochStatus.EXPIRED, recorded_at=at(4)),
    ]
    for ordered in (rows, list(reversed(rows))):
        log = EpochLog(ordered)
        assert log.tags() == {"x": 1}
        assert log.status(0) is EpochStatus.EXPIRED
        assert [e.epoch for e in log.snapshots()] == [1]
        assert all(e.status not in (TAGGED, UNTAGGED) for e in log.entries)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("v1", True),
        ("release-2026.11_a", True),
        ("a" * 100, True),
        ("a" * 101, False),
        ("1v", False),
        ("", False),
        ("has space", False),
        ("-x", False),
    ],
)
def test_tag_names(name: str, ok: bool) -> None:
    assert is_tag_name(name) is ok


def test_a_name_racing_retention_either_keeps_the_snapshot_or_is_refused(tmp_path: Path) -> None:
    """Threads released together on a real manifest: never a named snapshot that expired."""
    root, sink, writer = committed_root(tmp_path, 2)
    for epoch in range(2, 8):
        writer.record(prepared(epoch, sink, interval=1))
        done = writer.epochs.prepared(epoch)
        assert done is not None
        writer.commit([done])
        name = f"n{epoch}"
        outcomes = race(partial(tag, root, epoch - 1, name), partial(expire, root, 1))
        epochs = open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE)
        named = epochs.tags().get(name) == epoch - 1
        assert named != (epochs.status(epoch - 1) is EpochStatus.EXPIRED), (outcomes, epoch)
        if named:
            assert outcomes[0] is None
        else:
            assert isinstance(outcomes[0], (ManifestError, SnapshotNotFoundError)), outcomes
        # retention that lost the race to the name expires the rest all the same
        assert outcomes[1] is None, outcomes
        kept = {s.epoch for s in epochs.snapshots()}
        assert kept == {epoch, *epochs.tags().values()}, (outcomes, epoch)


def test_retention_that_loses_its_race_to_a_name_expires_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The name commits between retention's reading the manifest and its writing it."""
    root, _, _ = committed_root(tmp_path, 5)
    record_all = EpochWriter.record_all
    names = iter(["late"])

    def name_first(writer: EpochWriter, entries: Any) -> None:
        name = next(names, None)
        if name is not None:
            tag(root, 2, name)  # another process names epoch 2, which retention is expiring
        record_all(writer, entries)

    monkeypatch.setattr(EpochWriter, "record_all", name_first)
    assert expire(root, 1) == [0, 1, 3]
    epochs = open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE)
    assert [s.epoch for s in epochs.snapshots()] == [2, 4]
    assert epochs.tags() == {"late": 2}


def test_names_survive_expire_and_untag_lets_them_go(tmp_path: Path) -> None:
    root, _, _ = committed_root(tmp_path, 4)
    assert tag(root, 1, "keep").tags == ("keep",)
    assert tag(root, "keep", "also").tags == ("also", "keep")
    with pytest.raises(ConfigError, match=r"'keep' of .* already names epoch 1; untag it first"):
        tag(root, 2, "keep")
    assert tag(root, 2, "keep", move=True).tags == ("keep",)
    assert expire(root, 1) == [0]
    assert untag(root, "also") == 1
    assert expire(root, 1) == [1]
    assert untag(root, "keep") == 2
    with pytest.raises(SnapshotNotFoundError, match=r"is named 'keep'; the names are none"):
        untag(root, "keep")
    with pytest.raises(SnapshotNotFoundError, match=r"epoch 1 of snapshot root .* is EXPIRED"):
        tag(root, 1, "late")
    with pytest.raises(ConfigError, match=r"'1x' cannot name a savepoint"):
        tag(root, 3, "1x")
    assert expire(root, 1) == [2]


def skewed(monkeypatch: pytest.MonkeyPatch, minutes: float) -> None:
    """Record savepoint rows as a host whose clock is off by ``minutes`` would."""
    real = dt.datetime.now
    monkeypatch.setattr(
        "pyspark_abs.upkeep.tags.now",
        lambda: real(dt.timezone.utc) + dt.timedelta(minutes=minutes),
    )


def test_a_move_from_a_host_whose_clock_is_behind_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _, _ = committed_root(tmp_path, 6)
    tag(root, 1, "prod")
    skewed(monkeypatch, -5)
    assert tag(root, 4, "prod", move=True).tags == ("prod",)
    epochs = open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE)
    assert epochs.tags() == {"prod": 4}
    assert epochs.resolve("prod", SnapshotRoot(root)) == 4
    assert expire(root, 1) == [0, 1, 2, 3]
    assert (
        open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE).status(4) is EpochStatus.COMMITTED
    )


def test_an_untag_from_a_host_whose_clock_is_behind_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _, _ = committed_root(tmp_path, 3)
    skewed(monkeypatch, 10)
    tag(root, 1, "prod")
    skewed(monkeypatch, -10)
    assert untag(root, "prod") == 1
    assert open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE).tags() == {}
    assert expire(root, 1) == [0, 1]


def test_names_fold_in_commit_order_under_any_clocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A random schedule of names from hosts with random clocks, against a plain dict."""
    rng = random.Random(30)
    root, _, _ = committed_root(tmp_path, 4)
    model: dict[str, int] = {}
    for _step in range(30):
        skewed(monkeypatch, rng.uniform(-60, 60))
        name, epoch = rng.choice(["a", "b"]), rng.randrange(4)
        if name in model and rng.random() < 0.3:
            assert untag(root, name) == model.pop(name)
        else:
            tag(root, epoch, name, move=True)
            model[name] = epoch
        assert open_manifest(DeltaStore(), SnapshotRoot(root), PIPELINE).tags() == dict(
            sorted(model.items())
        )
