"""Fencing: one live run per snapshot root; a zombie that lost the root writes nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pyspark_abs import EpochStatus, Snapshots, rollback
from pyspark_abs.errors import FencingError
from pyspark_abs.protocol.lease import (
    LEASE_DIR,
    LEASE_SECONDS,
    break_lease,
    read_lease,
)
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.validation import validate
from tests.support.children import paused_child
from tests.support.inputs import EPOCHS, write_epochs
from tests.support.pipelines import (
    assert_same,
    assert_word_counts,
    expected_sink,
    expected_state,
    word_pipeline,
)

REPO = Path(__file__).parents[2]


def test_a_second_start_and_a_rollback_are_refused_while_a_run_holds_the_root(
    spark: SparkSession, tmp_path: Path
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:2])
    root = tmp_path / "root"
    first = word_pipeline(inputs, root, bronze=True).start(processing_time="100 milliseconds")
    try:
        first.process_all_available()
        with pytest.raises(
            FencingError,
            match=rf"pipeline 'wordcount' cannot start: snapshot root .*root is held by run "
            rf"{first.run_id} of pipeline 'wordcount' \(host \S+, pid {os.getpid()}, lease "
            rf"renewed \d+ s ago\)\. Stop that run first",
        ):
            word_pipeline(inputs, root, bronze=True).start()
        with pytest.raises(FencingError, match=rf"held by run {first.run_id} .* is refused"):
            rollback(str(root), 0)
    finally:
        first.stop()
    assert read_lease(SnapshotRoot(root)) is None
    write_epochs(inputs, EPOCHS)
    word_pipeline(inputs, root, bronze=True).run()
    assert_word_counts(spark, root, EPOCHS)


@pytest.mark.parametrize("pause", ["after_prepared:1", "between_table_commits:1"])
def test_a_zombie_that_lost_the_root_records_and_commits_nothing(
    spark: SparkSession, tmp_path: Path, pause: str
) -> None:
    """A run frozen after PREPARED, or past its lease check with one table of epoch 1
    committed, is taken over; resumed, it adds nothing: Delta's transaction ids make the
    taker skip (or the zombie find done) what the other committed, and the zombie's next
    lease check fences it before it records anything."""
    inputs, root, log, zombie = paused_word_count(tmp_path, "--pause", pause)
    try:
        holder = read_lease(SnapshotRoot(root))
        assert holder is not None
        assert holder.pid == zombie.pid
        with pytest.raises(
            FencingError, match=rf"is held by run {holder.run_id} .*pid {zombie.pid}"
        ):
            word_pipeline(inputs, root).start()

        break_lease(SnapshotRoot(root))  # its operator declares it gone; it is only paused
        taken_over = word_pipeline(inputs, root).run()
        assert taken_over.recovered_epochs == [1]
        versions = {t: DeltaStore().open(str(root / d)).version() for t, d in TABLES.items()}
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        zombie.wait(timeout=300)
    assert zombie.returncode != 0
    fenced = (
        f"pyspark_abs.errors.FencingError: run {holder.run_id} of pipeline 'wordcount' no "
        f"longer holds snapshot root {root}, now held by nobody"
    )
    # Renewal is compare-and-swap: even if the pause caught the zombie's renewal thread
    # between its read and its write, the renewal cannot put the zombie's lease back on
    # resume, so the zombie is always fenced.
    text = log.read_text()
    assert fenced in text, text[-3000:]
    entries = Snapshots(str(root)).list(include_aborted=True)
    assert [e.status for e in entries] == [EpochStatus.COMMITTED] * len(EPOCHS)
    by_zombie = [
        (r["epoch"], r["status"]) for r in manifest_rows(root) if r["run_id"] == holder.run_id
    ]
    assert by_zombie == [(0, "PREPARED"), (0, "COMMITTED"), (1, "PREPARED")]
    assert versions == {t: DeltaStore().open(str(root / d)).version() for t, d in TABLES.items()}
    assert_word_counts(spark, root, EPOCHS)
    assert validate(str(root)) == []


def age_lease(root: Path) -> str:
    """Make the root's lease look last renewed more than LEASE_SECONDS ago, without a new
    generation (as a stall or a wall clock step would leave it): its run id."""
    holder = read_lease(SnapshotRoot(root))
    assert holder is not None
    aged = {**asdict(holder), "renewed_at": time.time() - LEASE_SECONDS - 5}
    del aged["generation"]
    (root / LEASE_DIR / f"{holder.generation:012d}.json").write_text(json.dumps(aged))
    lapsed = read_lease(SnapshotRoot(root))
    assert lapsed is not None
    assert lapsed.generation == holder.generation
    assert not lapsed.is_live(time.time())
    return holder.run_id


def test_a_run_stalled_past_its_lease_that_nobody_took_over_goes_on_to_the_model(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A driver stalled longer than its lease (a long pause, a stalled machine, a wall clock
    stepped forward) whose root nobody took over renews its lease on resume and finishes
    its own run, with the counts of an uninterrupted one."""
    _, root, log, stalled = paused_word_count(tmp_path, "--pause", "after_prepared:1")
    try:
        run_id = age_lease(root)
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
        stalled.wait(timeout=300)
    assert stalled.returncode == 0, log.read_text()[-3000:]
    by_run = {r["run_id"] for r in manifest_rows(root) if r["epoch"] >= 1}
    assert by_run == {run_id}
    entries = Snapshots(str(root)).list(include_aborted=True)
    assert [e.status for e in entries] == [EpochStatus.COMMITTED] * len(EPOCHS)
    assert read_lease(SnapshotRoot(root)) is None
    assert_word_counts(spark, root, EPOCHS)
    assert validate(str(root)) == []


def test_a_rollback_of_a_stalled_run_whose_lease_lapsed_fences_it_for_good(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A rollback finding a lapsed lease breaks it before it writes: the stalled run, resumed,
    cannot renew it and records nothing more; the next run gives the model's counts."""
    inputs, root, log, stalled = paused_word_count(tmp_path, "--pause", "after_prepared:1")
    try:
        run_id = age_lease(root)
        rollback(str(root), 0)
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
        stalled.wait(timeout=300)
    assert stalled.returncode != 0
    text = log.read_text()
    assert f"run {run_id} of pipeline 'wordcount' no longer holds" in text, text[-3000:]
    assert "now held by nobody (the lease was broken)" in text, text[-3000:]
    by_run = [(r["epoch"], r["status"]) for r in manifest_rows(root) if r["run_id"] == run_id]
    assert by_run == [(0, "PREPARED"), (0, "COMMITTED"), (1, "PREPARED")]
    pipeline = word_pipeline(inputs, root)
    pipeline.run()
    snapshots = pipeline.snapshots
    assert_same(snapshots.state("word_count"), expected_state(spark, EPOCHS))
    assert_same(snapshots.sink("output"), expected_sink(spark, EPOCHS))
    assert validate(str(root)) == []


TABLES = {"state/word_count": "state/word_count", "sink/output": "sinks/word_counts"}


def paused_word_count(
    tmp_path: Path, *args: str
) -> tuple[Path, Path, Path, subprocess.Popen[bytes]]:
    """The example word count over ``EPOCHS`` (sync, 8 key groups) in a child, once it has
    paused itself: its input, root, log and process."""
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root, log = tmp_path / "root", tmp_path / "zombie.log"
    command = [sys.executable, "-m", "pyspark_abs.examples.wordcount", "--input", str(inputs)]
    command += ["--root", str(root), "--key-groups", "8", "--commit-mode", "sync", *args]
    child = paused_child(command, {**os.environ, "PYTHONPATH": str(REPO)}, log)
    return inputs, root, log, child


def manifest_rows(root: Path) -> list[dict[str, Any]]:
    """The manifest's rows in the order they were recorded."""
    rows: list[dict[str, Any]] = DeltaStore().read(str(root / "_manifest")).to_pylist()
    return sorted(rows, key=lambda r: (r["manifest_version"] or 0, r["recorded_at"]))


def test_a_zombie_compaction_commits_nothing_after_the_takeover(
    spark: SparkSession, tmp_path: Path
) -> None:
    pause = ("--compact-every", "2", "--pause", "during_compaction:1")
    inputs, root, log, zombie = paused_word_count(tmp_path, *pause)
    try:
        # stopped in its compaction thread, its files written and not committed; stop its
        # JVM too, which would go on planning micro-batches in the checkpoint
        os.killpg(zombie.pid, signal.SIGSTOP)
        break_lease(SnapshotRoot(root))
        word_pipeline(inputs, root).run()
        versions = {t: DeltaStore().open(str(root / d)).version() for t, d in TABLES.items()}
    finally:
        os.killpg(zombie.pid, signal.SIGCONT)
        zombie.wait(timeout=300)
    assert versions == {t: DeltaStore().open(str(root / d)).version() for t, d in TABLES.items()}
    text = log.read_text()
    assert "background compaction as of epoch 1 stopped: run" in text, text[-3000:]
    assert_word_counts(spark, root, EPOCHS)
    assert validate(str(root)) == []
