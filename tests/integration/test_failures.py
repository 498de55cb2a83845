"""Bad input and broken storage: a clear error, nothing committed, nothing lost."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from pyspark_abs import AbsConfig, EpochStatus, KeyState, Pipeline, Snapshots, operator
from pyspark_abs.errors import (
    AlignmentError,
    OperatorDefinitionError,
    OperatorError,
    PipelineMismatchError,
    PrecommitFileError,
    SchemaMismatchError,
    SnapshotNotFoundError,
    SnapshotRootError,
    TableSchemaError,
)
from pyspark_abs.examples import wordcount
from pyspark_abs.faults import Fault, FaultAction, FaultStep
from tests.support.inputs import EPOCHS, write_epochs
from tests.support.pipelines import STATE_DDL, assert_word_counts, sessions, word_pipeline


def failing_on(word: str, error: type[Exception] = ValueError) -> Any:
    @operator(key="word", state_schema="count long", output_schema=STATE_DDL, name="word_count")
    def counting(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        if key[0] == word:
            raise error(f"cannot count {word!r}")
        count = state.get({"count": 0})["count"] + len(rows)
        state.update({"count": count})
        return {"word": key[0], "count": count}

    return counting


def assert_epoch_aborted(root: Path, epoch: int, committed: int, message: str) -> None:
    """Epochs before ``epoch`` are committed, ``epoch`` is ABORTED with ``message``."""
    snapshots = Snapshots(str(root))
    infos = snapshots.list(include_aborted=True)
    assert [i.epoch for i in infos if i.status is EpochStatus.COMMITTED] == list(range(committed))
    aborted = snapshots.get(epoch)
    assert aborted.status is EpochStatus.ABORTED
    assert message in (aborted.error or "")


@pytest.mark.smoke
def test_user_error_names_operator_epoch_and_key_and_commits_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    broken = word_pipeline(inputs, root, op=failing_on("f"))
    with pytest.raises(
        OperatorError,
        match=r"operator 'word_count', epoch 2, key groups? [\d, ]+, key \('f',\): the function raised ValueError: cannot count 'f'",
    ) as raised:
        broken.run()
    # the user's own line, carried from the Python worker to the driver
    assert f"(at {__file__}:" in str(raised.value)
    assert 'in counting: raise error(f"cannot count {word!r}"))' in str(raised.value)
    assert_epoch_aborted(root, 2, committed=2, message="cannot count 'f'")
    # The fixed function picks up at epoch 2; nothing before or after is lost.
    word_pipeline(inputs, root).run()
    assert_word_counts(spark, root, EPOCHS)


def test_wrong_output_schema_commits_nothing(spark: SparkSession, tmp_path: Path) -> None:
    @operator(key="word", state_schema="count long", output_schema=STATE_DDL, name="word_count")
    def sloppy(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
        state.update({"count": len(rows)})
        return {"word": key[0], "total": len(rows)}

    inputs = write_epochs(tmp_path / "in", EPOCHS[:1])
    with pytest.raises(
        SchemaMismatchError,
        match=r"epoch 0, key groups? [\d, ]+, key \('\w',\): output 'output': missing column\(s\) \['count'\]; unexpected column\(s\) \['total'\]",
    ):
        word_pipeline(inputs, tmp_path / "root", op=sloppy).run()
    assert_epoch_aborted(tmp_path / "root", 0, committed=0, message="missing column")


@pytest.mark.parametrize(
    ("action", "error", "message"),
    [
        (
            FaultAction.DROP_MARKER,
            AlignmentError,
            r"epoch 1 of operator 'word_count': expected one barrier marker from each of 2 partitions, but no marker from partition\(s\) 0",
        ),
        (
            FaultAction.DELETE_FILE,
            PrecommitFileError,
            r"epoch 1: pre-committed file\(s\) damaged before commit: .*abs-e000000000001-.* is missing",
        ),
        (
            FaultAction.TRUNCATE_FILE,
            PrecommitFileError,
            r"epoch 1: .* has \d+ bytes, the marker says \d+",
        ),
    ],
)
def test_alignment_failures_commit_nothing_and_replay_cleanly(
    spark: SparkSession, tmp_path: Path, action: FaultAction, error: type[Exception], message: str
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    partition = (
        0 if action is FaultAction.DROP_MARKER else None
    )  # damage every partition's first file
    fault = Fault(FaultStep.PRECOMMIT_TASK, epoch=1, partition=partition, action=action)
    with pytest.raises(error, match=message):
        word_pipeline(inputs, root, faults=(fault,)).run()
    assert_epoch_aborted(root, 1, committed=1, message=error.__name__)
    # a partition whose marker was dropped wrote files no one listed; the others' are gone
    unlisted = "-p00000-" if action is FaultAction.DROP_MARKER else None
    files = (root / "state" / "word_count").glob("abs-e000000000001-*")
    leftovers = {p.name for p in files if unlisted is None or unlisted not in p.name}
    assert leftovers == set(), "the aborted epoch's listed files were not removed"
    word_pipeline(inputs, root).run()
    assert_word_counts(spark, root, EPOCHS)


def test_unwritable_snapshot_root(spark: SparkSession, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    inputs = write_epochs(tmp_path / "in", EPOCHS[:1])
    with pytest.raises(SnapshotRootError, match=r"snapshot root .*a-file/root is not writable"):
        word_pipeline(inputs, blocker / "root").start()


def test_root_of_another_pipeline_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:1])
    root = tmp_path / "root"
    word_pipeline(inputs, root).run()
    lines = spark.readStream.format("text").load(str(inputs))
    other = Pipeline(
        "other",
        wordcount.words_of(lines),
        wordcount.word_count,
        root=str(root),
        sinks=str(tmp_path / "other-sink"),
        checkpoint=str(tmp_path / "other-ckpt"),
    )
    with pytest.raises(
        PipelineMismatchError, match=r"belongs to pipeline 'wordcount', not 'other'"
    ):
        other.start()


def test_fresh_checkpoint_on_a_used_root_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:2])
    root = tmp_path / "root"
    word_pipeline(inputs, root).run()
    config = AbsConfig(key_groups=8)
    lines = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(inputs))
    moved = Pipeline(
        "wordcount",
        wordcount.words_of(lines),
        wordcount.word_count,
        root=str(root),
        sinks=str(root / "sinks" / "word_counts"),
        checkpoint=str(tmp_path / "new-ckpt"),
        config=config,
    )
    with pytest.raises(
        PipelineMismatchError, match=r"holds epochs up to 1 .* but checkpoint .*new-ckpt is new"
    ):
        moved.start()


def test_used_checkpoint_on_an_empty_root_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:1])
    word_pipeline(inputs, tmp_path / "root").run()
    lines = spark.readStream.format("text").load(str(inputs))
    elsewhere = Pipeline(
        "wordcount",
        wordcount.words_of(lines),
        wordcount.word_count,
        root=str(tmp_path / "other-root"),
        sinks=str(tmp_path / "sink"),
        checkpoint=str(tmp_path / "root" / "_checkpoint"),
    )
    with pytest.raises(
        PipelineMismatchError,
        match=r"has committed micro-batches up to 0, but snapshot root .*other-root has no snapshot",
    ):
        elsewhere.start()


def test_sink_with_another_schema_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "sink"), pa.table({"word": ["x"], "count": ["text"]}))
    inputs = write_epochs(tmp_path / "in", EPOCHS[:1])
    lines = spark.readStream.format("text").load(str(inputs))
    pipeline = Pipeline(
        "wordcount",
        wordcount.words_of(lines),
        wordcount.word_count,
        root=str(tmp_path / "root"),
        sinks=str(tmp_path / "sink"),
    )
    with pytest.raises(
        TableSchemaError, match=r"sink/output .* column 'count' is string, declared int64"
    ):
        pipeline.start()


@operator(
    key="word",
    state_schema="n long",
    output_schema="word string, n long",
    ttl=dt.timedelta(minutes=1),
    ttl_clock="event_time",
)
def expiring(key: tuple[Any, ...], rows: pd.DataFrame, state: KeyState) -> Any:
    state.update({"n": len(rows)})
    return {"word": key[0], "n": len(rows)}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sinks": {"elsewhere": "/tmp/x"}}, r"missing \['output'\], unknown \['elsewhere'\]"),
        ({"name": "white space"}, "pipeline name 'white space'"),
        ({"operator": "not an operator"}, "operator must be built with @operator"),
        ({"source": "static"}, "the source must be a streaming DataFrame"),
        (
            {"source": "no-key"},
            r"key column\(s\) \['word'\] of operator 'word_count' are not in the source",
        ),
        (
            {"sinks": "main.default.word_counts"},
            r"the sink of output 'output' is 'main.default.word_counts', a catalog table name; "
            r"sinks are Delta tables at a path, committed by delta-rs, which cannot commit to "
            r"Unity Catalog managed tables. Give a path",
        ),
        (
            {"sinks": {"output": "/tmp/x"}, "partition": ("nope",)},
            "partitioned by 'nope', which is not an output column",
        ),
        (
            {"operator": sessions},
            r"operator 'sessions' has event-time timeouts, but the source has no watermark "
            r"\(the source's columns are \['word'\]\); set one with transform=",
        ),
        (
            {"operator": expiring},
            r"operator 'expiring' has an event-time ttl, but the source has no watermark",
        ),
    ],
)
def test_inconsistent_pipelines_are_refused(
    spark: SparkSession, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    from pyspark_abs import DeltaSink

    lines = spark.readStream.format("text").load(str(write_epochs(tmp_path / "in", EPOCHS[:1])))
    args: dict[str, Any] = {
        "name": "wc",
        "source": wordcount.words_of(lines),
        "operator": wordcount.word_count,
        "sinks": str(tmp_path / "sink"),
    }
    args.update(change)
    if args["source"] == "static":
        args["source"] = spark.createDataFrame([("a",)], "word string")
    elif args["source"] == "no-key":
        args["source"] = lines
    if "partition" in args:
        args["sinks"] = DeltaSink(str(tmp_path / "sink"), args.pop("partition"))
    with pytest.raises(OperatorDefinitionError, match=message):
        Pipeline(
            args["name"],
            args["source"],
            args["operator"],
            root=str(tmp_path / "root"),
            sinks=args["sinks"],
        )


def test_reading_unknown_epochs_and_operators(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:2])
    pipeline = word_pipeline(inputs, tmp_path / "root")
    pipeline.run()
    snapshots = pipeline.snapshots
    with pytest.raises(
        SnapshotNotFoundError, match=r"epoch 7 .* is not in the manifest; readable epochs are 0..1"
    ):
        snapshots.state("word_count", 7)
    with pytest.raises(SnapshotNotFoundError, match=r"operator 'nope' is not in snapshot root"):
        snapshots.state("nope")
    with pytest.raises(SnapshotNotFoundError, match="is not a pyspark-abs snapshot root"):
        Snapshots(str(tmp_path / "in"))
    assert snapshots.operators() == ["word_count"]
    assert snapshots.sinks() == ["output"]
    assert snapshots.pipeline == "wordcount"
