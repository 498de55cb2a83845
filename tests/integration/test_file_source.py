"""FileSource: a landing directory that a rollback can rewind, file by file."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_abs import AbsConfig, FileSource, Pipeline, Snapshots, rollback
from pyspark_abs.errors import SourceError
from pyspark_abs.examples.wordcount import word_count
from tests.support.inputs import EPOCHS
from tests.support.pipelines import assert_same, expected_sink, expected_state


def land(directory: Path, texts: Sequence[str], first: int = 0) -> None:
    """One JSON-lines file of words per text, landing in order (increasing mtimes)."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts, start=first):
        path = directory / f"part-{i:04d}.json"
        path.write_text("".join(json.dumps({"word": w}) + "\n" for w in text.split()))
        os.utime(path, ns=(1_700_000_000_000_000_000 + i, 1_700_000_000_000_000_000 + i))


def pipeline(inputs: Path, root: Path) -> Pipeline:
    return Pipeline(
        "files",
        FileSource(str(inputs), "json", schema="word string", max_files_per_trigger=1),
        word_count,
        root=str(root),
        sinks=str(root / "sink"),
        config=AbsConfig(key_groups=4, commit_mode="sync"),
    )


@pytest.mark.smoke
def test_a_rollback_resumes_right_after_the_files_of_the_snapshot(
    spark: SparkSession, tmp_path: Path
) -> None:
    inputs, root = tmp_path / "in", tmp_path / "root"
    land(inputs, EPOCHS[:2])
    pipeline(inputs, root).run()
    land(inputs, EPOCHS[2:], first=2)  # new files are picked up as they land
    pipeline(inputs, root).run()
    snapshots = Snapshots(str(root), spark)
    assert [i.epoch for i in snapshots.list()] == list(range(len(EPOCHS)))

    rollback(str(root), 1)
    pipeline(inputs, root).run()  # reads files 2.. again, exactly once
    assert_same(snapshots.state("word_count"), expected_state(spark, EPOCHS))
    assert_same(snapshots.sink("output"), expected_sink(spark, EPOCHS))


def test_a_missing_folder_is_refused_before_the_root_is_created(
    spark: SparkSession, tmp_path: Path
) -> None:
    inputs, root = tmp_path / "in", tmp_path / "root"
    with pytest.raises(SourceError, match=r"in\): the folder does not exist"):
        pipeline(inputs, root).run()
    assert not root.exists()
    land(inputs, EPOCHS)
    pipeline(inputs, root).run()
    assert_same(Snapshots(str(root), spark).state("word_count"), expected_state(spark, EPOCHS))
