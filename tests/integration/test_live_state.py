"""Live state on local disk: Spark's state store holds markers, lost files are rebuilt.

With snapshots on, each key group's state lives in a file under ``local_state_dir`` and
Spark's state store keeps a 28-byte marker naming it. These tests delete the files at the
worst moments and check that the run's snapshots and sink still equal a direct count of the
input, as an uninterrupted run would give.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import SparkSession

from pyspark_abs import AbsConfig, EpochStatus, Pipeline, Snapshots, restore, rollback, write_state
from pyspark_abs.errors import (
    ConfigError,
    InjectedFault,
    PipelineMismatchError,
    SnapshotDamagedError,
    StorageError,
)
from pyspark_abs.examples.wordcount import word_count
from pyspark_abs.faults import Fault, FaultStep
from pyspark_abs.manifest.table import manifest_root_id
from pyspark_abs.operators.state_codec import (
    MARKER_BYTES,
    SLOT,
    Marker,
    decode_marker,
    decode_slot,
    encode_marker,
)
from pyspark_abs.protocol.live_state import LocalLiveState
from pyspark_abs.protocol.state_chain import read_chain
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.compaction import compact
from pyspark_abs.upkeep.retention import vacuum
from pyspark_abs.upkeep.validation import validate
from tests.support.docs import run_block
from tests.support.inputs import running_counts, write_epochs
from tests.support.pipelines import (
    STATE_DDL,
    assert_same,
    assert_word_counts,
    expected_sink,
    expected_state,
    word_pipeline,
)

EPOCHS = (
    "a b c a",
    "b d e",
    "a f a g h",
    "i b c j k l m n o p q r s t",
    "c c d u v w x y z",
    "i j k b e a l m n o p q r s t",
)
"""Epoch 3 changes many keys, epoch 4 others in the same key groups, epoch 5 epoch 3's again:
a key group rebuilt for epoch 4 without epoch 3's changes shows in epoch 5's counts."""


def stored_values(spark: SparkSession, checkpoint: Path) -> list[bytes]:
    """What Spark's state store keeps for each key group, read with Spark's state reader.

    A slot (one group of Spark's for several key groups) keeps a value per key group.
    """
    rows = spark.read.format("statestore").load(str(checkpoint)).select("value").collect()
    values = [bytes(r.value.groupState.blob) for r in rows]
    assert values, "Spark's state store holds nothing"
    assert all(v.startswith(SLOT) for v in values), "a checkpoint of this release has slots"
    return [entry.stored for v in values for entry in decode_slot(v).values()]


def assert_live_state_is_the_snapshot(
    spark: SparkSession, pipeline: Pipeline, local: Path, root: Path
) -> int:
    """Each key group's live state file that Spark's markers name holds exactly the newest
    snapshot's state of that key group; returns how many files were compared."""
    snapshot = Snapshots(str(root)).state_table("word_count")
    compared = 0
    for value in stored_values(spark, root / "_checkpoint"):
        marker = decode_marker(value)
        assert marker is not None
        found = list(local.rglob(f"kg-*/{marker.epoch:012d}-{marker.token.hex()}.abs"))
        if not found:
            continue  # not read since its file was lost: rebuilt when the key group runs
        folder = found[0].parent

        def path_of(m: Marker, folder: Path = folder) -> str:
            return str(folder / f"{m.epoch:012d}-{m.token.hex()}.abs")

        live, _ = read_chain(pipeline.plan, marker, path_of)
        group = int(folder.name.removeprefix("kg-"))
        mine = snapshot.filter(pc.equal(snapshot["_key_group"], pa.scalar(group, pa.int32())))
        expected = dict(zip(mine["word"].to_pylist(), mine["count"].to_pylist(), strict=True))
        assert dict(zip(live["word"].to_pylist(), live["count"].to_pylist(), strict=True)) == (
            expected
        ), f"key group {group}"
        compared += 1
    return compared


def test_spark_keeps_markers_and_lost_files_are_rebuilt_from_the_snapshots(
    spark: SparkSession, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    inputs = write_epochs(tmp_path / "in", EPOCHS[:3])
    root = tmp_path / "root"
    word_pipeline(inputs, root, bronze=True, local_state_dir=str(local)).run()
    values = stored_values(spark, root / "_checkpoint")
    assert values
    assert {(v[:4], len(v)) for v in values} == {(b"ABSM", MARKER_BYTES)}
    assert list(local.rglob("kg-*/*.abs")), "the state is on local disk"

    shutil.rmtree(local)  # a new cluster: the executors' disks are empty
    write_epochs(tmp_path / "in", EPOCHS[:5])
    word_pipeline(inputs, root, bronze=True, local_state_dir=str(local)).run()
    for lost in sorted(local.rglob("kg-*/*.abs"))[::2]:  # some key groups lose their file
        lost.unlink()
    write_epochs(tmp_path / "in", EPOCHS)
    pipeline = word_pipeline(inputs, root, bronze=True, local_state_dir=str(local))
    pipeline.run()
    assert assert_live_state_is_the_snapshot(spark, pipeline, local, root) >= 3

    assert_word_counts(spark, root, EPOCHS)
    assert validate(str(root)) == []


@pytest.mark.parametrize("lose", [False, True], ids=["files kept", "files lost"])
def test_a_replay_after_a_crash_rebuilds_from_a_snapshot_and_later_prepared_epochs(
    spark: SparkSession, tmp_path: Path, lose: bool
) -> None:
    """With snapshot_interval 3 the newest snapshot (epoch 2) is older than the key groups'
    markers when epoch 4 crashes after PREPARED: a rebuild applies epoch 3's pre-committed
    changes to snapshot 2, then the replay of decided epoch 4 installs its changes."""
    local = tmp_path / "local"
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    settings: dict[str, Any] = {
        "snapshot_interval": 3,
        "commit_mode": "async",
        "local_state_dir": str(local),
    }
    crash = (Fault(FaultStep.AFTER_PREPARED, 4),)
    with pytest.raises(InjectedFault, match="'after_prepared' of epoch 4"):
        word_pipeline(inputs, root, bronze=True, faults=crash, **settings).run()
    statuses = [(i.epoch, i.status) for i in Snapshots(str(root)).list()]
    assert statuses[-2:] == [(3, EpochStatus.PREPARED), (4, EpochStatus.PREPARED)]
    if lose:
        shutil.rmtree(local)
    pipeline = word_pipeline(inputs, root, bronze=True, **settings)
    pipeline.run()
    assert assert_live_state_is_the_snapshot(spark, pipeline, local, root) >= 3

    snapshots = Snapshots(str(root), spark)
    readable = [i.epoch for i in snapshots.list() if i.status is not EpochStatus.MERGED]
    assert readable == [2, 4, 5]
    for epoch in readable:
        assert_same(
            snapshots.state("word_count", epoch), expected_state(spark, EPOCHS[: epoch + 1])
        )
    assert_same(snapshots.sink("output"), expected_sink(spark, EPOCHS))
    assert validate(str(root)) == []


@pytest.mark.parametrize("install", ["rollback", "restore", "write_state"])
def test_a_new_cluster_after_a_restore_at_another_key_group_count_finds_every_key(
    spark: SparkSession, tmp_path: Path, install: str
) -> None:
    """Epoch 1's snapshot, taken with 4 key groups, is installed and the pipeline goes on
    with 7. Key "e", last changed in epoch 1, must be found in its new key group when the
    local files are lost before it comes again in the last epoch."""
    local = tmp_path / "local"
    inputs = write_epochs(tmp_path / "in", EPOCHS[:2])
    root = tmp_path / "root"

    def run(at: Path, key_groups: int) -> None:
        word_pipeline(
            inputs, at, bronze=True, local_state_dir=str(local), key_groups=key_groups
        ).run()

    run(root, 4)
    if install == "rollback":
        rollback(str(root), 1)
    elif install == "restore":
        restore(str(root), 1, str(tmp_path / "copy"))
        root = tmp_path / "copy"
    else:
        state = Snapshots(str(root), spark).state("word_count")
        write_state(state, str(root), word_count, config=AbsConfig(key_groups=4))
    write_epochs(tmp_path / "in", EPOCHS[:5])
    run(root, 7)
    shutil.rmtree(local)  # a new cluster
    write_epochs(tmp_path / "in", EPOCHS)
    run(root, 7)
    snapshots = Snapshots(str(root), spark)
    assert_same(snapshots.state("word_count"), expected_state(spark, EPOCHS))
    emitted = running_counts(EPOCHS)[1]
    if install == "restore":  # the copy's own sink begins after the restored epoch
        emitted = emitted[len(running_counts(EPOCHS[:2])[1]) :]
    assert_same(snapshots.sink("output"), spark.createDataFrame(emitted, STATE_DDL))
    assert validate(str(root)) == []


def test_a_restart_with_snapshots_off_is_refused_and_loses_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Snapshots off keeps state in Spark's store, one group per key group, and cannot read
    local files nor slots: the restart is refused at start, changes nothing, and the next
    start with snapshots on goes on as if it never happened."""
    local = tmp_path / "local"
    inputs = write_epochs(tmp_path / "in", EPOCHS[:2])
    root = tmp_path / "root"
    word_pipeline(inputs, root, bronze=True, local_state_dir=str(local)).run()
    write_epochs(tmp_path / "in", EPOCHS)
    before = Snapshots(str(root), spark).list()
    off = word_pipeline(inputs, root, bronze=True, snapshots=False)
    with pytest.raises(
        ConfigError,
        match=r"in \d+ slots \(it was written with snapshots on, outside Spark Connect\), which "
        r"a run with snapshots off cannot read",
    ):
        off.run()
    assert Snapshots(str(root), spark).list() == before
    word_pipeline(inputs, root, bronze=True, local_state_dir=str(local)).run()
    assert_word_counts(spark, root, EPOCHS)
    assert validate(str(root)) == []


def test_an_unwritable_local_state_dir_fails_the_epoch_clearly_and_loses_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A local_state_dir that cannot hold files (here: below a regular file) fails the first
    epoch with a StorageError naming the path and the setting; nothing is committed, and a
    restart with a usable directory gives the counts of an uninterrupted run."""
    inputs = write_epochs(tmp_path / "in", EPOCHS[:3])
    root = tmp_path / "root"
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the directory should be")
    unwritable = word_pipeline(inputs, root, bronze=True, local_state_dir=str(blocked))
    with pytest.raises(
        StorageError, match=r"epoch 0, key group \d+: cannot write the key group's live state"
    ) as raised:
        unwritable.run()
    assert "local_state_dir (spark.abs.localStateDir)" in str(raised.value)
    assert Snapshots(str(root)).list() == []  # epoch 0 was recorded ABORTED
    word_pipeline(inputs, root, bronze=True, local_state_dir=str(tmp_path / "ok")).run()
    assert_word_counts(spark, root, EPOCHS[:3])


def test_a_rebuild_from_an_unreadable_snapshot_fails_with_the_snapshot_named(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Local files lost and the snapshot they are rebuilt from damaged in a way the start's
    check cannot see (state files overwritten with zeros, sizes kept): the epoch fails with
    SnapshotDamagedError naming the snapshot, and commits nothing."""
    local = tmp_path / "local"
    inputs = write_epochs(tmp_path / "in", EPOCHS[:2])
    root = tmp_path / "root"
    word_pipeline(inputs, root, bronze=True, local_state_dir=str(local)).run()
    shutil.rmtree(local)
    for data in (root / "state" / "word_count").glob("*.parquet"):
        data.write_bytes(bytes(data.stat().st_size))
    before = [(i.epoch, i.status) for i in Snapshots(str(root)).list()]
    write_epochs(tmp_path / "in", EPOCHS[:3])
    with pytest.raises(
        SnapshotDamagedError,
        match=r"rebuilt from snapshot 1 \(version \d+ of state/word_count at .*\), which cannot "
        r"be read: .*Run validate",
    ):
        word_pipeline(inputs, root, bronze=True, local_state_dir=str(local)).run()
    after = [(i.epoch, i.status) for i in Snapshots(str(root)).list()]
    assert after == before


def test_a_root_copied_as_a_directory_runs_beside_its_original_on_one_host(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``cp -r`` of a root (same root id) on the host of the original, with the same
    local_state_dir: the two keep separate live-state folders and each equals a direct count
    of what it read; the copy may not write the original's sink."""
    local = tmp_path / "local"
    inputs = write_epochs(tmp_path / "in", EPOCHS[:3])
    root, copy = tmp_path / "root", tmp_path / "copy"
    word_pipeline(inputs, root, bronze=True, local_state_dir=str(local)).run()
    shutil.copytree(root, copy)
    shared = word_pipeline(inputs, copy, bronze=True, local_state_dir=str(local))
    shared_sink = Pipeline(
        "wordcount",
        shared.source,
        shared.operator,
        root=str(copy),
        sinks={"output": f"{root}/sinks/word_counts"},
        config=shared.config,
        transform=shared.transform,
    )
    with pytest.raises(PipelineMismatchError, match=r"is a copy of .*/root \(both have root id"):
        shared_sink.run()
    write_epochs(tmp_path / "in", EPOCHS[:5])
    word_pipeline(inputs, root, bronze=True, local_state_dir=str(local)).run()
    write_epochs(tmp_path / "in", EPOCHS)
    word_pipeline(inputs, copy, bronze=True, local_state_dir=str(local)).run()
    word_pipeline(inputs, root, bronze=True, local_state_dir=str(local)).run()
    assert len(list((local / "pyspark-abs-state").iterdir())) == 2
    for each in (root, copy):
        assert_word_counts(spark, each, EPOCHS)
        assert validate(str(each)) == []


def test_a_rebuild_racing_compaction_and_vacuum_reads_the_manifest_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A worker read the manifest when snapshot 2 was the newest and epochs 3 and 4 were
    PREPARED (snapshot_interval 3, a crash). While its micro-batch ran, a restart committed
    them and epoch 5, a compaction at 4 replaced their files and vacuum with keep_last=1
    deleted them. A key group whose rebuild needs epochs 3 and 4 finds their files gone: it
    reads the manifest again and rebuilds from snapshot 5 instead of failing."""
    inputs = write_epochs(tmp_path / "in", EPOCHS[:5])
    root = tmp_path / "root"
    settings: dict[str, Any] = {"snapshot_interval": 3, "commit_mode": "async"}
    crash = (Fault(FaultStep.AFTER_PREPARED, 4),)
    pipeline = word_pipeline(inputs, root, bronze=True, faults=crash, **settings)
    with pytest.raises(InjectedFault):
        pipeline.run()
    table = "state/word_count"
    live = LocalLiveState.for_root(
        SnapshotRoot(root),
        manifest_root_id(DeltaStore(), SnapshotRoot(root)),
        table,
        f"{root}/{table}",
        str(tmp_path / "worker"),
        0,
        "test",
        AbsConfig().local_state_change_share,
    )

    def counts(state: pa.Table) -> dict[str, int]:
        return {str(r["word"]): int(r["count"]) for r in state.to_pylist()}

    def rebuilt(key_group: int, marker_epoch: int) -> dict[str, int]:
        marker = encode_marker(Marker(marker_epoch, bytes(16), marker_epoch))
        return counts(live.load(pipeline.plan, key_group, marker, 6))

    def counts_of(key_group: int, epoch: int) -> dict[str, int]:
        state = Snapshots(str(root)).state_table("word_count", epoch)
        return counts(state.filter(pc.equal(state["_key_group"], pa.scalar(key_group, pa.int32()))))

    first = Snapshots(str(root)).state_table("word_count", 2)["_key_group"][0].as_py()
    assert rebuilt(first, 2) == counts_of(first, 2)  # reads (and keeps) the manifest of now
    word_pipeline(inputs, root, bronze=True, **settings).run()
    compact(str(root))
    at4 = Snapshots(str(root)).state_table("word_count", 4)
    write_epochs(tmp_path / "in", EPOCHS)
    word_pipeline(inputs, root, bronze=True, **settings).run()
    vacuum(str(root), keep_last=1, min_age_seconds=0)
    assert [i.epoch for i in Snapshots(str(root)).list() if i.status.value != "EXPIRED"] == [5]
    at5 = Snapshots(str(root)).state_table("word_count", 5)
    in_5 = set(at5.filter(pc.equal(at5["_epoch"], pa.scalar(5)))["_key_group"].to_pylist())
    target = next(
        int(r["_key_group"])
        for r in at4.to_pylist()
        if r["_epoch"] in (3, 4) and r["_key_group"] not in in_5
    )
    assert rebuilt(target, 4) == counts_of(target, 5)


def chain_files(local: Path) -> list[Path]:
    """The change files under ``local``, oldest first within each key group."""
    return sorted(p for p in local.rglob("kg-*/*.abs") if p.read_bytes()[:4] == b"ABSD")


CHAINED = (
    " ".join(f"w{i}" for i in range(1500)),
    *(" ".join(f"w{(37 * e + 11 * i) % 1600}" for i in range(12)) for e in range(1, 10)),
)
"""1,500 keys, then epochs that change 12 of them (some new): key groups go on chains."""


def assert_uninterrupted(spark: SparkSession, root: Path, epochs: Sequence[str]) -> None:
    """The state and the sink are those of an uninterrupted run over ``epochs``."""
    snapshots = Snapshots(str(root), spark)
    assert_same(snapshots.state("word_count"), expected_state(spark, epochs))
    assert_same(snapshots.sink("output"), expected_sink(spark, epochs))


def test_chains_of_change_files_survive_lost_links_a_crash_a_new_cluster_and_rollbacks(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Steady epochs write change files on chains; a lost link in the middle of a chain, a
    crash after PREPARED, a new cluster and two rollbacks each leave the counts, the
    snapshots and the sink those of the uninterrupted run."""
    local = tmp_path / "local"
    inputs = write_epochs(tmp_path / "in", CHAINED[:5])
    root = tmp_path / "root"
    settings: dict[str, Any] = {"key_groups": 2, "local_state_dir": str(local)}
    word_pipeline(inputs, root, bronze=True, **settings).run()
    links = chain_files(local)
    assert len(links) >= 4, "steady epochs wrote change files"
    largest = max(p.stat().st_size for p in local.rglob("kg-*/*.abs"))
    assert all(p.stat().st_size * 10 < largest for p in links)
    for lost in (links[0], links[-2]):  # the oldest link of one key group, one in the middle
        lost.unlink()
    write_epochs(tmp_path / "in", CHAINED[:8])
    crash = (Fault(FaultStep.AFTER_PREPARED, 6),)
    with pytest.raises(InjectedFault, match="'after_prepared' of epoch 6"):
        word_pipeline(inputs, root, bronze=True, faults=crash, **settings).run()
    pipeline = word_pipeline(inputs, root, bronze=True, **settings)
    pipeline.run()
    assert assert_live_state_is_the_snapshot(spark, pipeline, local, root) >= 1
    assert_word_counts(spark, root, CHAINED[:8])

    for epoch in (6, 3):  # rolled back twice, the second time past files still on chains
        rollback(str(root), epoch)
    write_epochs(tmp_path / "in", CHAINED[:9])
    word_pipeline(inputs, root, bronze=True, **settings).run()
    assert_uninterrupted(spark, root, CHAINED[:9])
    shutil.rmtree(local)  # a new cluster
    write_epochs(tmp_path / "in", CHAINED)
    word_pipeline(inputs, root, bronze=True, **settings).run()
    assert_uninterrupted(spark, root, CHAINED)
    assert validate(str(root)) == []


def test_the_readme_change_share_settings_chain_or_write_whole_files_with_equal_results(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The documentation's two settings: a share of one half writes change files, a share of 0
    writes whole files only; both give the uninterrupted run's counts and sink."""
    shares = {
        "config = AbsConfig(local_state_change_share=0.5)": "chained = AbsConfig("
        "local_state_change_share=0.5)",
        "config = AbsConfig(local_state_change_share=0)": "whole = AbsConfig("
        "local_state_change_share=0)",
    }
    ns: dict[str, object] = {}
    run_block("config = AbsConfig(local_state_change_share=0.5)", ns, shares)
    for name in ("chained", "whole"):
        config = ns[name]
        assert isinstance(config, AbsConfig)
        local, root = tmp_path / name / "local", tmp_path / name / "root"
        inputs = write_epochs(tmp_path / name / "in", CHAINED[:6])
        word_pipeline(
            inputs,
            root,
            bronze=True,
            key_groups=2,
            local_state_dir=str(local),
            local_state_change_share=config.local_state_change_share,
        ).run()
        assert bool(chain_files(local)) == (name == "chained")
        assert_uninterrupted(spark, root, CHAINED[:6])


def test_restarts_that_switch_the_change_share_keep_the_uninterrupted_results(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Chains written with one share are read after a restart with share 0, which writes
    whole files from then on, and chains start again after a restart with a share: every
    run gives the uninterrupted run's state and sink."""
    local, root = tmp_path / "local", tmp_path / "root"
    settings: dict[str, Any] = {"key_groups": 2, "local_state_dir": str(local)}
    for upto, share in ((4, 0.5), (6, 0.0), (9, 0.25)):
        inputs = write_epochs(tmp_path / "in", CHAINED[:upto])
        before = set(chain_files(local))
        pipeline = word_pipeline(
            inputs, root, bronze=True, local_state_change_share=share, **settings
        )
        pipeline.run()
        assert bool(set(chain_files(local)) - before) == (share > 0), share
        assert_uninterrupted(spark, root, CHAINED[:upto])
