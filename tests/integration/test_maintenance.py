"""Compaction, retention, vacuum and validation of a real snapshot root."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pandas as pd
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pyspark_abs import KeyState, Snapshots, operator, rollback
from pyspark_abs.errors import CommitError, ConfigError, ManifestError, SnapshotNotFoundError
from pyspark_abs.faults import Fault, FaultAction, FaultStep
from pyspark_abs.manifest.table import open_root
from pyspark_abs.operators.changelog import latest_per_key
from pyspark_abs.storage.root import SnapshotRoot, sink_table
from pyspark_abs.storage.store import DeltaStore
from pyspark_abs.upkeep.compaction import compact
from pyspark_abs.upkeep.retention import vacuum
from pyspark_abs.upkeep.validation import validate
from tests.support.docs import block_with
from tests.support.inputs import EPOCHS, race, write_epochs
from tests.support.pipelines import (
    STATE_DDL,
    assert_same,
    assert_word_counts,
    expected_history,
    expected_state,
    state_history,
    word_pipeline,
)
from tests.support.versions import land_and_run, sink_of

STATE = "state/word_count"
MORE = ("a l m", "b a n")


def live_files(table: Path) -> list[str]:
    return [Path(u).name for u in DeltaTable(str(table)).file_uris()]


@pytest.mark.smoke
def test_compaction_keeps_every_epoch_readable(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "root"
    word_pipeline(write_epochs(tmp_path / "in", EPOCHS), root).run()
    files_before = live_files(root / STATE)
    assert len(files_before) > 1

    (result,) = compact(str(root))
    assert (result.table, result.as_of_epoch, result.files_before) == (STATE, 3, len(files_before))
    assert result.rows_after == Snapshots(str(root), spark).get(3).state_keys
    assert result.rows_before > result.rows_after
    assert all(name.startswith("abs-c") for name in live_files(root / STATE))
    assert_word_counts(spark, root, EPOCHS)
    assert validate(str(root)) == []


def test_background_compaction_while_the_pipeline_runs(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "root"
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    word_pipeline(inputs, root, compaction_every_epochs=2, commit_mode="async").run()
    assert any(name.startswith("abs-c") for name in live_files(root / STATE))
    assert_word_counts(spark, root, EPOCHS)
    assert validate(str(root)) == []


def test_the_readme_maintenance_block_runs_on_a_real_root(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    word_pipeline(write_epochs(tmp_path / "in", EPOCHS), root).run()
    block = block_with("from pyspark_abs import compact, vacuum, validate")
    scope: dict[str, Any] = {}
    exec(block.replace("/data/abs/orders", str(root)), scope)
    assert scope["report"].expired == []
    assert all(name.startswith("abs-c") for name in live_files(root / STATE))
    assert_word_counts(spark, root, EPOCHS)


def test_retention_and_vacuum(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "root"
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    word_pipeline(inputs, root).run()
    compact(str(root))
    DeltaTable(str(root / STATE)).create_checkpoint()  # below the snapshots vacuum keeps
    write_epochs(inputs, (*EPOCHS, *MORE))
    word_pipeline(inputs, root).run()
    state_dir = root / STATE
    orphan = state_dir / "abs-e000000000001-p00000-a7-0123456789ab-000.parquet"
    orphan.write_bytes(b"left by a failed task attempt")
    in_flight = state_dir / "abs-e000000000099-p00000-a0-0123456789ab-000.parquet"
    in_flight.write_bytes(b"written by an epoch not decided yet")
    before = set(p.name for p in state_dir.glob("*.parquet"))

    dry = vacuum(str(root), keep_last=2, dry_run=True)
    assert dry.dry_run
    assert orphan.name in dry.deleted[STATE]
    assert set(p.name for p in state_dir.glob("*.parquet")) == before
    assert "EXPIRED" not in {s.status.value for s in Snapshots(str(root), spark).list()}

    report = vacuum(str(root), keep_last=2)
    assert report.expired == dry.expired == [0, 1, 2, 3]
    assert report.deleted == dry.deleted
    assert orphan.name in report.deleted[STATE]
    assert not orphan.exists()
    assert in_flight.exists()
    assert report.kept_in_flight >= 1
    assert dry.log_removed == {}
    assert report.log_removed[STATE][0] == f"{0:020d}.json"
    assert not (state_dir / "_delta_log" / f"{0:020d}.json").exists()
    assert not any(p.name.startswith("abs-e000000000000") for p in state_dir.glob("*.parquet"))

    snapshots = Snapshots(str(root), spark)
    statuses = {s.epoch: s.status.value for s in snapshots.list()}
    assert statuses == {
        0: "EXPIRED",
        1: "EXPIRED",
        2: "EXPIRED",
        3: "EXPIRED",
        4: "COMMITTED",
        5: "COMMITTED",
    }
    history = state_history(snapshots)
    assert_same(history, expected_history(spark, (*EPOCHS, *MORE)).where("as_of >= 4"))
    with pytest.raises(
        SnapshotNotFoundError, match=r"epoch 1 .* is EXPIRED; readable epochs are 4\.\.5"
    ):
        snapshots.state("word_count", 1)
    with pytest.raises(SnapshotNotFoundError, match="is EXPIRED"):
        rollback(str(root), 2)
    in_flight.unlink()
    assert validate(str(root)) == []


def test_validate_reports_damage(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "root"
    word_pipeline(write_epochs(tmp_path / "in", EPOCHS), root).run()
    state_file = sorted((root / STATE).glob("abs-e000000000002-*.parquet"))[0]
    state_file.unlink()
    sink_dir = root / "sinks" / "word_counts"
    sink_file = sorted(sink_dir.glob("abs-e000000000003-*.parquet"))[0]
    sink_file.write_bytes(sink_file.read_bytes()[:20])

    problems = [str(p) for p in validate(str(root))]
    assert f"epoch 2, table {STATE}: file {state_file.name} of version" in "\n".join(problems)
    assert any(
        p.startswith("epoch 3, table sink/output: file") and "has 20 bytes" in p for p in problems
    )
    assert not any(p.startswith(("epoch 0", "epoch 1")) for p in problems)


@operator(key="word", state_schema="count long", output_schema=STATE_DDL, name="word_count")
def count_below_three(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    """Counts words and removes a word's state once it is seen three times."""
    count = state.get({"count": 0})["count"] + len(rows)
    if count >= 3:
        state.remove()
    else:
        state.update({"count": count})
    return {"word": key[0], "count": count}


def live_state(root: Path, epoch: int | None = None) -> dict[str, int]:
    """The state table's live keys as of a snapshot's version, or of its latest version."""
    store = DeltaStore()
    uri = str(root / STATE)
    version = None
    if epoch is not None:
        entry = open_root(store, SnapshotRoot(root)).latest(epoch)
        assert entry is not None
        version = entry.table_versions[STATE]
    live = latest_per_key(store.read(uri, version), ["word"], epoch)
    return {row["word"]: row["count"] for row in live.select(["word", "count"]).to_pylist()}


def paused_compaction(root: Path) -> subprocess.Popen[bytes]:
    """``compact`` in another process, stopped after writing its files, before committing."""
    fault = Fault(FaultStep.DURING_COMPACTION, action=FaultAction.PAUSE)
    script = (
        "import sys; from pyspark_abs import AbsConfig; "
        "from pyspark_abs.faults import Fault, FaultAction, FaultStep; "
        "from pyspark_abs.upkeep.compaction import compact; "
        f"done = compact(sys.argv[1], config=AbsConfig(faults=(Fault({fault.step.value!r}, "
        f"action={fault.action.value!r}),))); print([r.skipped for r in done])"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(root)], start_new_session=True, stdout=subprocess.PIPE
    )
    _, status = os.waitpid(process.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), f"the compaction ended before its commit (status {status})"
    return process


def resume(process: subprocess.Popen[bytes]) -> str:
    """Let the paused compaction go on; what it says for each table it skipped."""
    os.kill(process.pid, signal.SIGCONT)
    out, _ = process.communicate(timeout=120)
    assert process.returncode == 0
    return out.decode()


def test_two_racing_compactions_resurrect_no_deleted_key(
    spark: SparkSession, tmp_path: Path
) -> None:
    root, inputs = tmp_path / "root", tmp_path / "in"
    word_pipeline(write_epochs(inputs, EPOCHS[:3]), root, op=count_below_three).run()
    stale = paused_compaction(root)  # as of epoch 2, where "b" is live
    try:
        word_pipeline(write_epochs(inputs, EPOCHS), root, op=count_below_three).run()
        before = {epoch: live_state(root, epoch) for epoch in range(4)}
        assert "b" in before[2]
        assert "b" not in before[3]
        compact(str(root))  # as of epoch 3, where "b" is removed
    finally:
        said = resume(stale)
    assert "already compacted as of epoch 3 by another compaction" in said
    assert live_state(root) == before[3]
    assert {epoch: live_state(root, epoch) for epoch in range(4)} == before
    assert validate(str(root)) == []


def test_compaction_racing_a_rollback_leaves_the_rolled_back_state(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    word_pipeline(
        write_epochs(tmp_path / "in", EPOCHS), root, op=count_below_three, bronze=True
    ).run()
    as_of_1 = live_state(root, 1)
    stale = paused_compaction(root)  # as of epoch 3
    try:
        restored = rollback(str(root), 1)
    finally:
        said = resume(stale)
    assert "a rollback or restore replaced it" in said
    assert live_state(root, restored.epoch) == as_of_1
    assert live_state(root) == as_of_1
    assert validate(str(root)) == []


def test_vacuum_deletes_only_files_it_can_prove_dead(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "root"
    word_pipeline(write_epochs(tmp_path / "in", EPOCHS), root).run()
    state, sink = root / STATE, root / "sinks" / "word_counts"
    mine = SnapshotRoot(root).tag
    assert all(f"-t{mine}-" in name for name in live_files(sink))
    long_ago = time.time() - 86_400 * 2
    kept = {
        # an epoch newer than every decided one: a long micro-batch still writing
        state / f"abs-e000000000004-t{mine}-p00000-a0-0123456789ab-000.parquet": long_ago,
        # a compaction that has written its files and not committed yet
        state / "abs-c000000000003-compact-0123456789ab-000.parquet": time.time(),
        # names pyspark-abs does not write
        state / "part-00000-written-by-someone-else.snappy.parquet": long_ago,
        sink / "part-00000-written-by-someone-else.snappy.parquet": long_ago,
        # another pipeline writing the same sink, its epoch 1 still in flight
        sink / "abs-e000000000001-t0badbeef-p00000-a0-0123456789ab-000.parquet": long_ago,
    }
    orphans = [
        state / f"abs-e000000000001-t{mine}-p00000-a7-0123456789ab-000.parquet",
        sink / f"abs-e000000000002-t{mine}-p00001-a3-0123456789ab-000.parquet",
        state / "abs-e000000000001-p00000-a7-0123456789ab-000.parquet",  # no tag: older names
    ]
    for path, modified in kept.items():
        path.write_bytes(b"not committed")
        os.utime(path, (modified, modified))
    for path in orphans:
        path.write_bytes(b"left by a failed task attempt")

    report = vacuum(str(root), min_age_seconds=0)
    assert [path for path in kept if not path.exists()] == []
    assert [path for path in orphans if path.exists()] == []
    assert report.kept_in_flight >= len(kept)
    for path in kept:
        path.unlink()
    assert validate(str(root)) == []


def test_validate_tells_a_log_expired_by_delta_from_damage(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    word_pipeline(write_epochs(tmp_path / "in", EPOCHS), root).run()
    state = DeltaTable(str(root / STATE))
    for table in (state, DeltaTable(str(root / "sinks" / "word_counts"))):
        assert table.metadata().configuration.get("delta.enableExpiredLogCleanup") == "false"

    # A table with Delta's default log retention (as older pyspark-abs created them), its
    # log older than the retention: writing a checkpoint cleans up the log before it.
    state.alter.set_table_properties(
        {"delta.enableExpiredLogCleanup": "true", "delta.logRetentionDuration": "interval 1 hour"}
    )
    long_ago = time.time() - 7200
    for entry in (root / STATE / "_delta_log").iterdir():
        os.utime(entry, (long_ago, long_ago))
    state.create_checkpoint()
    state.cleanup_metadata()
    assert not (root / STATE / "_delta_log" / f"{1:020d}.json").exists()

    problems = validate(str(root))
    assert [p.epoch for p in problems] == [0, 1, 2, 3]
    for problem in problems:
        assert problem.table == STATE
        assert "Delta log entries expired" in problem.message
        assert "delta.enableExpiredLogCleanup=false" in problem.message


def manifest_counts(root: Path) -> Counter[tuple[int, str]]:
    """How often each (epoch, status) is in the manifest table, duplicates included."""
    rows = DeltaStore().read(str(root / "_manifest"), columns=["epoch", "status"]).to_pylist()
    return Counter((r["epoch"], r["status"]) for r in rows)


def test_concurrent_rollbacks_and_vacuums_leave_a_loadable_root(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two rollbacks, then two vacuums, racing on one root: no transition is recorded twice."""
    root = tmp_path / "root"
    word_pipeline(write_epochs(tmp_path / "in", EPOCHS), root, bronze=True).run()
    for _round in range(3):
        outcomes = race(lambda: rollback(str(root), 1), lambda: rollback(str(root), 1))
        assert None in outcomes, outcomes
        for outcome in outcomes:
            # The loser lost the manifest race for the restore epoch; or, having loaded the
            # manifest after the winner's PREPARED, its recovery raced the winner's commit
            # of that epoch and lost the table race (the epoch is committed once either way).
            # A loser that reloads after the winner's commit sees the restore epoch RESTORED.
            if isinstance(outcome, CommitError):
                assert "stays PREPARED" in str(outcome), outcome
            elif outcome is not None:
                assert isinstance(outcome, ManifestError), outcome
                assert re.search(
                    r"epoch \d+: PREPARED is not recorded at snapshot root .*: another writer "
                    r"recorded (PREPARED|RESTORED) for epoch \d+",
                    str(outcome),
                ), outcome
        counts = manifest_counts(root)
        assert set(counts.values()) == {1}, counts
    restores = [s for s in Snapshots(str(root), spark).list() if s.status.value == "RESTORED"]
    assert 3 <= len(restores) <= 6
    assert_same(Snapshots(str(root), spark).state("word_count"), expected_state(spark, EPOCHS[:2]))

    outcomes = race(
        lambda: vacuum(str(root), keep_last=1, min_age_seconds=0),
        lambda: vacuum(str(root), keep_last=1, min_age_seconds=0),
    )
    assert outcomes == [None, None]
    counts = manifest_counts(root)
    assert set(counts.values()) == {1}, counts
    snapshots = Snapshots(str(root), spark).list()
    assert [s.status.value for s in snapshots].count("EXPIRED") == len(snapshots) - 1
    assert_same(Snapshots(str(root), spark).state("word_count"), expected_state(spark, EPOCHS[:2]))
    assert validate(str(root)) == []


def test_vacuum_keeps_a_sinks_removed_files_for_its_retention(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Files a rollback removed from a sink stay for the sink's deletedFileRetentionDuration
    (Delta's 7 days by default), so every version a lagging reader may still read stays
    readable; a retention of 0, given or set on the table, lets vacuum delete them."""
    landing, root = tmp_path / "landing", tmp_path / "root"
    sink = sink_of(root)
    for first in range(5):
        land_and_run(landing, root, [EPOCHS[first % len(EPOCHS)]], first=first)
    caught_up = version_of_epoch(root, 2)
    rollback(str(root), 2)
    for first in range(5, 7):
        land_and_run(landing, root, [EPOCHS[first % len(EPOCHS)]], first=first)
    versions = range(caught_up, int(DeltaTable(sink).version()) + 1)

    def readable() -> dict[int, list[Any]]:
        return {
            v: sorted(DeltaTable(sink, version=v).to_pyarrow_table().to_pylist(), key=str)
            for v in versions
        }

    before = readable()
    rolled_back = [p for p in removed_by_log(sink) if re.search(r"abs-e00000000000[34]-", p)]
    assert rolled_back

    kept = vacuum(str(root), keep_last=2)
    assert readable() == before
    assert not set(kept.deleted.get(sink_table("output"), [])) & set(rolled_back)
    with pytest.raises(ConfigError, match="removed_file_retention_seconds must be 0 or more"):
        vacuum(str(root), keep_last=1, removed_file_retention_seconds=-1)
    assert readable() == before

    DeltaTable(sink).alter.set_table_properties(
        {"delta.deletedFileRetentionDuration": "interval 0 seconds"}
    )
    gone = vacuum(str(root), keep_last=2)
    assert set(rolled_back) <= set(gone.deleted[sink_table("output")])
    assert not any((Path(sink) / p).exists() for p in rolled_back)
    # the sink as it is now reads as before
    latest = max(versions)
    now = sorted(DeltaTable(sink).to_pyarrow_table().to_pylist(), key=str)
    assert now == before[latest]


def version_of_epoch(root: Path, epoch: int) -> int:
    (entry,) = [
        e for e in open_root(DeltaStore(), SnapshotRoot(root)).snapshots() if e.epoch == epoch
    ]
    return int(entry.table_versions[sink_table("output")])


def removed_by_log(sink: str) -> list[str]:
    """Paths the sink's log removes, read from its JSON entries."""
    removed = []
    for log in sorted((Path(sink) / "_delta_log").glob("*.json")):
        for line in log.read_text().splitlines():
            action = json.loads(line) if line else {}
            if "remove" in action:
                removed.append(unquote(action["remove"]["path"]))
    return removed
