"""Storage faults: unwritable logs and a full disk mid-run, damaged files and Delta logs.

Each fault stops the pipeline with an error naming the epoch and the table, keeps every
committed epoch, and the next start (once the storage is fixed) finishes the input exactly
once; damaged snapshots are reported by validate and refused by start and rollback, which
name the newest intact snapshot.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from pyspark_abs import (
    AbsConfig,
    EpochStatus,
    KeyState,
    Operator,
    Pipeline,
    Snapshots,
    operator,
    rollback,
    vacuum,
)
from pyspark_abs.errors import (
    CommitError,
    InjectedFault,
    SnapshotDamagedError,
    SnapshotRootError,
    StorageError,
    UncommittableEpochError,
)
from pyspark_abs.examples import wordcount
from pyspark_abs.faults import Fault, FaultStep
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.validation import validate
from tests.support.docs import run_block
from tests.support.inputs import EPOCHS, running_counts, write_epochs
from tests.support.pipelines import (
    STATE_DDL,
    assert_same,
    assert_word_counts,
    expected_sink,
    expected_state,
    word_pipeline,
)

STATE = "state/word_count"
SINK = "sink/output"


def sabotaging(word: str, sabotage: Callable[[], None]) -> Operator:
    """A per-key word count that damages the storage when it meets ``word`` (in epoch 2)."""

    @operator(key="word", state_schema="count long", output_schema=STATE_DDL, name="word_count")
    def counting(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        if key[0] == word:
            sabotage()
        count = state.get({"count": 0})["count"] + len(rows)
        state.update({"count": count})
        return {"word": key[0], "count": count}

    return counting


def assert_stopped_before(root: Path, epoch: int, status: EpochStatus | None) -> None:
    """Epochs before ``epoch`` are committed; ``epoch`` has ``status`` (None: no entry)."""
    snapshots = Snapshots(str(root))
    infos = {i.epoch: i.status for i in snapshots.list(include_aborted=True)}
    assert {e: s for e, s in infos.items() if e < epoch} == {
        e: EpochStatus.COMMITTED for e in range(epoch)
    }
    assert infos.get(epoch) is status
    assert max(infos) <= epoch
    sink_version = DeltaStore().open(str(root / "sinks" / "word_counts")).version()
    assert sink_version == snapshots.get(epoch - 1).table_versions[SINK]


def chattr(path: Path, flag: str) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True, capture_output=True)


@pytest.fixture
def immutable_dirs() -> Iterator[list[Path]]:
    """Directories a test makes immutable (``chattr +i``, which also binds root); undone after."""
    probe = Path(__file__).parent / ".chattr-probe"
    made: list[Path] = []
    try:
        probe.mkdir(exist_ok=True)
        chattr(probe, "+i")
        chattr(probe, "-i")
    except (OSError, subprocess.CalledProcessError) as err:
        pytest.skip(f"cannot make a directory immutable here (chattr needs root on ext4): {err}")
    finally:
        probe.rmdir()
    yield made
    for path in made:
        chattr(path, "-i")


@pytest.mark.parametrize(
    ("log", "error", "message", "status"),
    [
        (
            "_manifest",
            SnapshotRootError,
            r"epoch 2: cannot record PREPARED in the manifest at .*/root/_manifest: ",
            None,
        ),
        (
            "sinks/word_counts",
            CommitError,
            r"epoch 2: committing \d+ file\(s\) to the table at .*/root/sinks/word_counts failed: "
            r".* The epoch stays PREPARED and is committed on restart",
            EpochStatus.PREPARED,
        ),
    ],
    ids=["manifest", "sink"],
)
def test_log_becomes_unwritable_mid_run(
    spark: SparkSession,
    tmp_path: Path,
    immutable_dirs: list[Path],
    log: str,
    error: type[Exception],
    message: str,
    status: EpochStatus | None,
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    delta_log = root / log / "_delta_log"
    immutable_dirs.append(delta_log)
    op = sabotaging("f", lambda: chattr(delta_log, "+i"))
    with pytest.raises(error, match=message):
        word_pipeline(inputs, root, op=op).run()
    chattr(delta_log, "-i")
    assert_stopped_before(root, 2, status)

    restarted = word_pipeline(inputs, root).run()
    assert restarted.recovered_epochs == ([2] if status is EpochStatus.PREPARED else [])
    assert_word_counts(spark, root, EPOCHS)
    assert validate(str(root)) == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs, so that the disk can fill up."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def fill(directory: Path) -> None:
    """Fill the file system of ``directory`` up to the last byte, once.

    Only once: a task attempt of the failed run that starts after the test freed the disk
    would otherwise fill it again under the restarted run.
    """
    try:
        (directory / "filled").touch(exist_ok=False)
    except FileExistsError:
        return
    with (directory / "filler").open("ab") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise


def test_disk_full_mid_run(spark: SparkSession, tmp_path: Path, small_disk: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = small_disk / "root"

    def pipeline(op: Operator) -> Pipeline:
        lines = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(inputs))
        return Pipeline(
            "wordcount",
            wordcount.words_of(lines),
            op,
            root=str(root),
            sinks=str(root / "sinks" / "word_counts"),
            checkpoint=str(tmp_path / "checkpoint"),  # Spark's own files stay writable
            config=AbsConfig(key_groups=8, commit_mode="sync"),
        )

    with pytest.raises(
        StorageError,
        match=r"epoch 2: cannot write file abs-e000000000002-\S+ \(\d+ bytes\) of table "
        r"(state/word_count|sink/output) at .*/disk/root/\S+: .*No space left on device. Free "
        r"space on that storage or make it writable; nothing of the epoch is committed",
    ):
        pipeline(sabotaging("f", lambda: fill(small_disk))).run()
    (small_disk / "filler").unlink()
    # Recording ABORTED may itself have failed on the full disk.
    aborted = Snapshots(str(root)).list(include_aborted=True)[-1]
    assert_stopped_before(root, 2, aborted.status if aborted.epoch == 2 else None)

    pipeline(wordcount.word_count).run()
    assert_word_counts(spark, root, EPOCHS)
    assert validate(str(root)) == []


def test_a_decided_epoch_whose_file_was_deleted_is_replaced_by_a_rollback(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Epoch 2 was decided, then a file it wrote to the sink was deleted before its commit:
    no start can commit it. The start says so and what to do, a rollback replaces the epoch,
    and the pipeline then gives what the uninterrupted one gives."""
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    crash = (Fault(FaultStep.AFTER_PREPARED, epoch=2),)
    with pytest.raises(InjectedFault):
        word_pipeline(inputs, root, bronze=True, faults=crash).run()
    lost = committed_files(root, SINK, 2)[0]
    lost.unlink()
    with pytest.raises(
        UncommittableEpochError,
        match=rf"epoch 2 can never be committed: its file {lost.name} of sink/output at \S+ is "
        rf"gone, so no start .* can commit it \(epoch 2: file .* is missing.*\)\. Put the "
        rf"files back from a backup and start again, or roll back to a snapshot, which replaces "
        rf"it: pyspark_abs.rollback\('{root}', 1\) or an earlier epoch",
    ):
        word_pipeline(inputs, root, bronze=True).run()

    assert [str(problem) for problem in validate(str(root))] == [
        f"epoch 2: decided (PREPARED) but no start can commit it: its file {lost.name} of "
        f"{SINK} at {root}/sinks/word_counts is gone"
    ]
    run_block(
        'rollback("/data/abs/wordcount", newest.epoch)', {}, {"/data/abs/wordcount": str(root)}
    )
    replaced = Snapshots(str(root)).get(2)
    assert replaced.status is EpochStatus.ABORTED
    assert f"epoch 2 can never be committed: its file {lost.name}" in (replaced.error or "")
    left = committed_files(root, STATE, 2)
    assert left, "epoch 2 wrote no state file"
    vacuum(str(root), min_age_seconds=0)
    assert not any(path.exists() for path in left), "vacuum kept the replaced epoch's files"
    word_pipeline(inputs, root, bronze=True).run()
    snapshots = Snapshots(str(root), spark)
    assert_same(snapshots.state("word_count"), expected_state(spark, EPOCHS))
    assert_same(snapshots.sink("output"), expected_sink(spark, EPOCHS))
    assert validate(str(root)) == []


def committed_files(root: Path, table: str, epoch: int) -> list[Path]:
    directory = root / ("state/word_count" if table == STATE else "sinks/word_counts")
    return sorted(directory.glob(f"abs-e{epoch:012d}-*.parquet"))


def test_damaged_data_files_are_reported_and_refused(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    word_pipeline(inputs, root, bronze=True).run()
    snapshots = Snapshots(str(root), spark)
    versions = {i.epoch: i.table_versions for i in snapshots.list()}
    state_file = committed_files(root, STATE, 2)[0]
    state_file.unlink()
    sink_file = committed_files(root, SINK, 3)[0]
    size = sink_file.stat().st_size
    sink_file.write_bytes(sink_file.read_bytes()[:20])

    assert sorted(str(p) for p in validate(str(root))) == sorted(
        [
            f"epoch 2, table {STATE}: file {state_file.name} of version {versions[2][STATE]} "
            f"is missing",
            f"epoch 3, table {STATE}: file {state_file.name} of version {versions[3][STATE]} "
            f"is missing",
            f"epoch 3, table {SINK}: file {sink_file.name} of version {versions[3][SINK]} has "
            f"20 bytes, the log records {size}",
        ]
    )
    manifest_before = len(snapshots.manifest().collect())
    write_epochs(inputs, (*EPOCHS, "z"))
    with pytest.raises(
        SnapshotDamagedError,
        match=rf"epoch 3 of snapshot root \S+ is damaged: table {STATE}: file "
        rf"{state_file.name} of version \d+ is missing; table {SINK}: file {sink_file.name} of "
        rf"version \d+ has 20 bytes, the log records {size}. The pipeline cannot continue "
        r"from it. Nothing was changed. Put the files back from a backup, or roll back to the "
        r"newest intact snapshot, epoch 1 \(pyspark_abs.rollback\(.*, 1\)\)",
    ):
        word_pipeline(inputs, root, bronze=True).start()
    for epoch in (3, 2):
        with pytest.raises(
            SnapshotDamagedError,
            match=rf"epoch {epoch} .* is damaged: .* It cannot be restored. .* epoch 1 ",
        ):
            rollback(str(root), epoch)
    assert len(snapshots.manifest().collect()) == manifest_before

    restored = rollback(str(root), 1)
    after = Snapshots(str(root), spark)
    assert_same(after.sink("output", restored.epoch), expected_sink(spark, EPOCHS[:2]))
    counts, _ = running_counts(EPOCHS[:2])
    state = {r.word: r["count"] for r in after.state("word_count", restored.epoch).collect()}
    assert state == counts


def test_damaged_delta_log_is_reported_and_refused(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    word_pipeline(inputs, root, bronze=True).run()
    version = Snapshots(str(root)).get(3).table_versions[SINK]
    entry = root / "sinks" / "word_counts" / "_delta_log" / f"{version:020d}.json"
    good = entry.read_bytes()
    entry.write_bytes(good[: len(good) // 2])

    problems = [str(p) for p in validate(str(root))]
    assert [p.split(":")[0] for p in problems] == [f"table {SINK}", f"epoch 3, table {SINK}"]
    assert problems[0].startswith(f"table {SINK}: the latest version cannot be loaded: ")
    assert f"version {version} cannot be loaded: " in problems[1]
    refusal = (
        rf"the Delta log of table {SINK} at .*/sinks/word_counts cannot be read up to its latest "
        r"version \(epoch {} is at version \d+\): .* {} Nothing was changed. Put the damaged "
        r"log entry back from a backup"
    )
    with pytest.raises(
        SnapshotDamagedError, match=refusal.format(3, "The pipeline cannot continue from it.")
    ):
        word_pipeline(inputs, root, bronze=True).start()
    with pytest.raises(SnapshotDamagedError, match=refusal.format(1, "It cannot be restored.")):
        rollback(str(root), 1)

    # Moving the damaged entry aside loses epoch 3's sink commit: validate and start say so,
    # and rolling back to epoch 2 then works.
    shutil.move(entry, tmp_path / entry.name)
    assert [str(p).split(":")[0] for p in validate(str(root))] == [f"epoch 3, table {SINK}"]
    with pytest.raises(SnapshotDamagedError, match=r"epoch 3 .* is damaged: .* epoch 2 "):
        word_pipeline(inputs, root, bronze=True).start()
    restored = rollback(str(root), 2)
    assert_same(
        Snapshots(str(root), spark).sink("output", restored.epoch),
        expected_sink(spark, EPOCHS[:3]),
    )
