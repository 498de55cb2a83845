"""The documentation's first command, ``scripts/demo``, on a small input: it crashes the word count
after a PREPARED epoch, recovers, restores an earlier snapshot into a new root at another
scale, and exits 0 only if its own checks hold. Its roots are then checked here against a
word count computed from the input, not by the demo's code."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from pyspark.sql import SparkSession

from pyspark_abs import Snapshots
from tests.support.inputs import EPOCHS, running_counts, write_epochs
from tests.support.pipelines import STATE_DDL, assert_same, assert_word_counts

DEMO = Path(__file__).parents[2] / "scripts" / "demo.py"


def demo(*options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEMO), *options], capture_output=True, text=True, timeout=900
    )


def test_the_demo_crashes_recovers_and_restores_at_another_scale(
    spark: SparkSession, tmp_path: Path
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    run = demo("--input", str(inputs), "--root", str(root), "--crash-epoch", "2")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "manifest after the crash:" in run.stdout
    assert "    2  PREPARED" in run.stdout

    assert_word_counts(spark, root, EPOCHS)
    restored = Snapshots(str(root.with_name("root-restored")), spark)
    assert_same(restored.state("word_count"), Snapshots(str(root), spark).state("word_count"))
    _, emitted = running_counts(EPOCHS)
    _, through_restored = running_counts(EPOCHS[:2])
    after = Counter(emitted) - Counter(through_restored)
    assert_same(restored.sink("output"), spark.createDataFrame(list(after.elements()), STATE_DDL))


def test_the_demo_refuses_a_crash_epoch_its_input_does_not_reach(tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    run = demo("--input", str(inputs), "--root", str(tmp_path / "root"), "--crash-epoch", "4")
    assert run.returncode == 2
    assert "--crash-epoch must be between 1 and 3" in run.stderr
    assert not (tmp_path / "root").exists()
