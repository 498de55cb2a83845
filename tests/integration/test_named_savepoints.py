"""Named savepoints: stop with a name, outlive retention, roll back and restore by name, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_abs import AbsConfig, DeltaSource, Pipeline, Snapshots, restore, rollback, untag
from pyspark_abs.cli import main as cli
from pyspark_abs.errors import ConfigError, SnapshotNotFoundError
from pyspark_abs.examples.wordcount import word_count
from pyspark_abs.upkeep.retention import vacuum
from pyspark_abs.upkeep.validation import validate
from tests.support.inputs import EPOCHS
from tests.support.pipelines import OP, assert_same, counts_df, word_table


def pipeline(root: Path, words: Path, sink: Path | None = None) -> Pipeline:
    return Pipeline(
        "words",
        DeltaSource(str(words), max_files_per_trigger=1),
        word_count,
        root=str(root),
        sinks={"output": str(sink or root / "sink")},
        config=AbsConfig(key_groups=4, commit_mode="sync"),
    )


def test_a_named_savepoint_outlives_retention_and_a_rollback_to_it_equals_a_clean_run(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    words, root = tmp_path / "words", tmp_path / "root"
    word_table(words, EPOCHS[:2])
    query = pipeline(root, words).start(available_now=True)
    query.await_termination()
    named = query.stop(savepoint="v1")
    assert named is not None
    assert (named.epoch, named.tags) == (1, ("v1",))

    word_table(words, EPOCHS[2:])
    query = pipeline(root, words).start(available_now=True)
    query.await_termination()
    with pytest.raises(ConfigError, match=r"savepoint 'v1' of .* already names epoch 1"):
        query.stop(savepoint="v1")
    assert query.stop(savepoint="v2") is not None
    snapshots = Snapshots(str(root), spark)
    assert snapshots.tags() == {"v1": 1, "v2": 3}
    assert [(i.epoch, i.tags) for i in snapshots.list()] == [
        (0, ()),
        (1, ("v1",)),
        (2, ()),
        (3, ("v2",)),
    ]

    assert vacuum(str(root), keep_last=1, min_age_seconds=0).expired == [0, 2]
    assert validate(str(root)) == []
    assert_same(snapshots.state(OP, "v1"), counts_df(spark, EPOCHS[:2]))

    copy = tmp_path / "copy"
    assert restore(str(root), "v1", str(copy)).epoch == 1
    assert_same(Snapshots(str(copy), spark).state(OP), counts_df(spark, EPOCHS[:2]))

    restored = rollback(str(root), "v1")
    assert restored.restored_from == 1
    pipeline(root, words).run()
    clean = tmp_path / "clean"
    pipeline(clean, words).run()
    assert_same(snapshots.state(OP), Snapshots(str(clean), spark).state(OP))
    assert_same(snapshots.sink("output"), Snapshots(str(clean), spark).sink("output"))
    # the name stays on epoch 1: a second rollback to it installs the same snapshot again
    assert rollback(str(root), "v1").restored_from == 1
    pipeline(root, words).run()
    assert_same(snapshots.state(OP), Snapshots(str(clean), spark).state(OP))
    assert_same(snapshots.sink("output"), Snapshots(str(clean), spark).sink("output"))
    # names belong to their root: the copy restored from 'v1' has none
    assert Snapshots(str(copy), spark).tags() == {}

    assert untag(str(root), "v1") == 1
    with pytest.raises(SnapshotNotFoundError, match=r"is named 'v1'; the names are 'v2'"):
        rollback(str(root), "v1")
    assert 1 in vacuum(str(root), keep_last=1, min_age_seconds=0).expired

    def run(*args: str) -> tuple[int, str, str]:
        status = cli(list(args))
        out, err = capsys.readouterr()
        return status, out, err

    newest = str(snapshots.list()[-1].epoch)
    assert run("tag", str(root), newest, "prod")[0] == 0
    status, out, _ = run("snapshots", str(root))
    assert status == 0
    assert [line.split()[0] for line in out.splitlines() if "savepoint 'prod'" in line] == [newest]
    status, out, _ = run("describe", str(root), "prod", "--json")
    assert (status, json.loads(out)["tags"]) == (0, ["prod"])
    status, out, _ = run("state", str(root), OP, "--epoch", "prod", "--json")
    assert status == 0
    expected = {r["word"]: r["count"] for r in counts_df(spark, EPOCHS).collect()}
    assert {r["word"]: r["count"] for r in json.loads(out)} == expected
    for args, message in [
        (("tag", str(root), newest, "9lives"), "'9lives' cannot name a savepoint"),
        (("tag", str(root), "0", "prod"), "epoch 0 of snapshot root"),
        (("untag", str(root), "nope"), "no savepoint of snapshot root"),
        (("rollback", str(root), "nope"), "is named 'nope'; the names are 'prod', 'v2'"),
    ]:
        status, out, err = run(*args)
        assert (status, out) == (2, ""), args
        assert message in err, (args, err)
        assert len(err.strip().splitlines()) == 1
    assert run("untag", str(root), "prod")[0] == 0
    assert Snapshots(str(root)).tags() == {"v2": 3}
