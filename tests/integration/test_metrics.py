"""Per-epoch metrics: the manifest, the metrics DataFrame, listeners, the log line, the CLI."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from pyspark_abs import AbsConfig, Pipeline, SnapshotInfo, SnapshotListener, Snapshots
from pyspark_abs.cli import main as cli
from pyspark_abs.errors import ConfigError, InjectedFault
from pyspark_abs.examples import wordcount
from pyspark_abs.faults import Fault, FaultStep
from tests.support.inputs import EPOCHS, write_epochs


class Recorder(SnapshotListener):
    def __init__(self) -> None:
        self.committed: list[SnapshotInfo] = []
        self.aborted: list[SnapshotInfo] = []

    def on_epoch_committed(self, info: SnapshotInfo) -> None:
        self.committed.append(info)

    def on_epoch_aborted(self, info: SnapshotInfo) -> None:
        self.aborted.append(info)


class Broken(SnapshotListener):
    def on_epoch_committed(self, info: SnapshotInfo) -> None:
        raise RuntimeError("dashboard is down")


def pipeline(
    spark: SparkSession, inputs: Path, root: Path, config: AbsConfig, *listeners: SnapshotListener
) -> Pipeline:
    lines = spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(inputs))
    return Pipeline(
        "metrics",
        wordcount.words_of(lines),
        wordcount.word_count,
        root=str(root),
        sinks=str(root / "sink"),
        config=config,
        listeners=listeners,
    )


def test_metrics_reach_listeners_the_dataframe_the_log_and_the_cli(
    spark: SparkSession,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    recorder = Recorder()
    config = AbsConfig(key_groups=4, commit_mode="async")
    with caplog.at_level(logging.INFO, logger="pyspark_abs"):
        query = pipeline(spark, inputs, tmp_path / "root", config, Broken(), recorder).run()

    # Each committed epoch reached the listener (after a failing one) with Spark's ids.
    snapshots = Snapshots(str(tmp_path / "root"), spark)
    assert [i.epoch for i in recorder.committed] == [0, 1, 2, 3]
    assert {i.query_id for i in recorder.committed} == {query.query.id}
    assert [i.batch_id for i in recorder.committed] == [0, 1, 2, 3]
    assert "snapshot listener Broken failed on epoch 0" in caplog.text
    assert len([r for r in caplog.messages if " COMMITTED: " in r]) == 4

    # The DataFrame holds what the listener saw, with totals and per-table maps.
    metrics = snapshots.metrics()
    expected = spark.createDataFrame(
        [
            (i.epoch, sum(i.rows.values()), i.rows["state/word_count"], i.state_keys)
            for i in recorder.committed
        ],
        "epoch long, rows long, state_rows long, state_keys long",
    )
    actual = metrics.selectExpr(
        "epoch", "rows", "rows_by_table['state/word_count'] AS state_rows", "state_keys"
    )
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
    metrics.createOrReplaceTempView("abs_metrics")
    timed = spark.sql(
        "SELECT count(*) FROM abs_metrics WHERE batch_ms > 0 AND precommit_ms > 0 "
        "AND align_wait_ms >= 0 AND commit_ms > 0 AND prepare_ms > 0 AND bytes > 0 "
        "AND pending_epochs BETWEEN 0 AND 2"
    ).first()
    assert timed is not None
    assert timed[0] == 4

    # The CLI prints the same epochs as a table and as JSON.
    assert cli(["metrics", str(tmp_path / "root"), "--last", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["epoch", "status", "rows", "bytes"]
    assert [line.split()[0] for line in lines[1:]] == ["2", "3"]
    assert cli(["metrics", str(tmp_path / "root"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [r["rows"] for r in printed] == [sum(i.rows.values()) for i in recorder.committed]


def test_aborted_epochs_reach_listeners_and_the_metrics(
    spark: SparkSession, tmp_path: Path
) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:2])
    recorder = Recorder()
    fault = AbsConfig(key_groups=4, faults=(Fault(FaultStep.AFTER_ALIGN, epoch=1),))
    with pytest.raises(Exception, match="after_align"):
        pipeline(spark, inputs, tmp_path / "root", fault, recorder).run()
    assert [i.epoch for i in recorder.committed] == [0]
    assert [i.epoch for i in recorder.aborted] == [1]
    assert InjectedFault.__name__ in (recorder.aborted[0].error or "")
    statuses = Snapshots(str(tmp_path / "root")).metrics_table(include_aborted=True)
    assert statuses.select(["epoch", "status"]).to_pylist() == [
        {"epoch": 0, "status": "COMMITTED"},
        {"epoch": 1, "status": "ABORTED"},
    ]


def test_a_listener_must_be_a_snapshot_listener(spark: SparkSession, tmp_path: Path) -> None:
    inputs = write_epochs(tmp_path / "in", EPOCHS[:1])
    with pytest.raises(ConfigError, match="listeners must be SnapshotListener instances"):
        pipeline(spark, inputs, tmp_path / "root", AbsConfig(), print)  # type: ignore[arg-type]
