"""Timestamps round-trip exactly in every session time zone, across a DST change and a rollback.

The operator sees timestamps as time-zone-aware datetimes in the session time zone, returns
them unchanged (to its output and its state), and formats them as local wall-clock text; all
three are compared with what Spark itself computes from the input in the same zone.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from chispa import assert_df_equality
from deltalake import write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    ArrowContext,
    DeltaSource,
    Job,
    KeyGroupContext,
    KeyGroupResult,
    Pipeline,
    Snapshots,
    arrow_operator,
    local_session,
    rollback,
    vectorized_operator,
    write_state,
)
from pyspark_abs.testing import assert_sink_equal, assert_state_equal
from tests.support.pipelines import sessions

UTC = dt.UTC
EPOCHS = [
    # 05:30Z and 06:30Z are both 01:30 in New York on 2026-11-01 (clocks go back at 06:00Z).
    [
        ("a", dt.datetime(2026, 11, 1, 5, 30, tzinfo=UTC)),
        ("b", dt.datetime(2026, 3, 8, 7, 30, tzinfo=UTC)),
    ],
    [
        ("a", dt.datetime(2026, 11, 1, 6, 30, tzinfo=UTC)),
        ("c", dt.datetime(2026, 6, 1, 18, 45, 1, 250, tzinfo=UTC)),
    ],
    [
        ("b", dt.datetime(2026, 3, 8, 6, 59, 59, tzinfo=UTC)),
        ("a", dt.datetime(2026, 11, 1, 5, 59, tzinfo=UTC)),
    ],
]
LOCAL_FORMAT = "%Y-%m-%d %H:%M:%S%z"
SPARK_FORMAT = "yyyy-MM-dd HH:mm:ssxx"


@vectorized_operator(
    key="word",
    state_schema="latest timestamp, seen timestamp",
    output_schema="word string, ts timestamp, latest timestamp, local string",
)
def latest(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    for frame, column in ((rows, "ts"), (state, "latest")):
        dtype = frame[column].dtype
        assert isinstance(dtype, pd.DatetimeTZDtype), f"{column} is {dtype}, not zone-aware"
    merged = rows.merge(state, on="word", how="left")
    merged["latest"] = merged[["ts", "latest"]].max(axis=1)
    newest = merged.sort_values("ts").groupby("word", as_index=False).agg(latest=("latest", "max"))
    newest["seen"] = newest["latest"]
    output = merged[["word", "ts", "latest"]].assign(local=merged["ts"].dt.strftime(LOCAL_FORMAT))
    return KeyGroupResult(state=newest, output=output)


@arrow_operator(
    key="word",
    state_schema="latest timestamp, seen timestamp",
    output_schema="word string, ts timestamp, latest timestamp, local string",
    name="latest",
)
def latest_arrow(rows: pa.Table, state: pa.Table, ctx: ArrowContext) -> KeyGroupResult:
    """``latest`` in the Arrow form: instants arrive and leave as zone-aware Arrow timestamps."""
    zone = ctx.time_zone
    for table, column in ((rows, "ts"), (state, "latest")):
        kind = table.schema.field(column).type
        assert kind == pa.timestamp("us", zone), f"{column} is {kind}, not in {zone}"
    merged = rows.join(state.select(["word", "latest"]), "word", join_type="left outer")
    greater: Any = pc.greater(merged["latest"], merged["ts"])
    later: Any = pc.fill_null(greater, False)
    merged = merged.set_column(
        merged.schema.get_field_index("latest"),
        "latest",
        pc.if_else(later, merged["latest"], merged["ts"]),
    )
    newest = merged.group_by("word").aggregate([("latest", "max")])
    newest = newest.rename_columns(["word", "latest"])
    output = merged.select(["word", "ts", "latest"]).append_column(
        "local",
        pc.strftime(merged["ts"].cast(pa.timestamp("s", zone), safe=False), LOCAL_FORMAT),  # type: ignore[arg-type]
    )
    return KeyGroupResult(state=newest.append_column("seen", newest["latest"]), output=output)


FORMS = {"pandas": latest, "arrow": latest_arrow}


def write_bronze(path: Path, epochs: Sequence[Sequence[tuple[str, dt.datetime]]] = EPOCHS) -> None:
    for events in epochs:
        words, stamps = zip(*events, strict=True)
        table = pa.table(
            {
                "word": pa.array(words, pa.string()),
                "ts": pa.array(stamps, pa.timestamp("us", tz="UTC")),
            }
        )
        write_deltalake(str(path), table, mode="append")


def pipeline(bronze: Path, root: Path, sink: Path, operator: Any = latest) -> Pipeline:
    return Pipeline(
        "zones",
        DeltaSource(str(bronze), max_files_per_trigger=1),
        operator,
        root=str(root),
        sinks={"output": str(sink)},
        config=AbsConfig(
            key_groups=2, commit_mode="sync", local_state_dir=str(root.parent / "local")
        ),
    )


def expected(spark: SparkSession, bronze: Path, epochs: int) -> tuple[DataFrame, DataFrame]:
    """The sink and the state after ``epochs`` epochs, computed by Spark in the session zone."""
    rows = spark.createDataFrame(
        [(w, t, i) for i, events in enumerate(EPOCHS) for w, t in events],
        "word string, ts timestamp, epoch int",
    ).where(F.col("epoch") < epochs)
    earlier = rows.alias("r").join(
        rows.alias("o"),
        (F.col("r.word") == F.col("o.word")) & (F.col("o.epoch") < F.col("r.epoch")),
        "left",
    )
    sink = earlier.groupBy(F.col("r.word").alias("word"), F.col("r.ts").alias("ts")).agg(
        F.greatest(F.first("r.ts"), F.max("o.ts")).alias("latest")
    )
    sink = sink.withColumn("local", F.date_format("ts", SPARK_FORMAT))
    state = (
        rows.groupBy("word").agg(F.max("ts").alias("latest")).withColumn("seen", F.col("latest"))
    )
    return sink, state


@pytest.fixture
def zone(spark: SparkSession, request: pytest.FixtureRequest) -> Iterator[str]:
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", request.param)
    try:
        yield request.param
    finally:
        spark.conf.set("spark.sql.session.timeZone", before or "UTC")


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "America/New_York"], indirect=True)
def test_timestamps_round_trip_in_the_session_time_zone(
    spark: SparkSession, tmp_path: Path, zone: str, form: str
) -> None:
    bronze, root, sink = tmp_path / "bronze", tmp_path / "root", tmp_path / "sink"
    write_bronze(bronze)
    pipeline(bronze, root, sink, FORMS[form]).run()
    want_sink, want_state = expected(spark, bronze, len(EPOCHS))
    assert_sink_equal(root, "output", want_sink)
    assert_state_equal(root, "latest", want_state)
    if zone != "America/New_York":
        return
    # a rollback reinstalls the state through Spark: the ambiguous 01:30 must survive it
    rollback(str(root), 1)
    pipeline(bronze, root, sink, FORMS[form]).run()
    assert_sink_equal(root, "output", want_sink)
    assert_state_equal(root, "latest", want_state)


@pytest.mark.parametrize("zone", ["Asia/Kolkata"], indirect=True)
def test_local_session_keeps_the_time_zone_of_the_running_session(
    spark: SparkSession, zone: str
) -> None:
    assert local_session(shuffle_partitions=2) is spark
    assert spark.conf.get("spark.sql.session.timeZone") == zone


@pytest.mark.parametrize("zone", ["UTC"], indirect=True)
def test_a_restart_and_an_edit_in_another_time_zone_keep_every_instant(
    spark: SparkSession, tmp_path: Path, zone: str
) -> None:
    bronze, root, sink = tmp_path / "bronze", tmp_path / "root", tmp_path / "sink"
    write_bronze(bronze, EPOCHS[:1])
    pipeline(bronze, root, sink).run()  # in UTC
    shutil.rmtree(tmp_path / "local")  # a new cluster: the state is rebuilt from the snapshot
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    write_bronze(bronze, EPOCHS[1:])
    pipeline(bronze, root, sink).run()
    want_sink, want_state = expected(spark, bronze, len(EPOCHS))
    snapshots = Snapshots(str(root), spark)
    assert_df_equality(
        snapshots.sink("output").drop("local"),
        want_sink.drop("local"),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    assert_state_equal(root, "latest", want_state)
    write_state(snapshots.state("latest"), str(root), latest)  # read and written in New York
    spark.conf.set("spark.sql.session.timeZone", "Asia/Kolkata")
    assert_state_equal(root, "latest", want_state)


@vectorized_operator(key="word", state_schema="n long", output_schema="word string, ts timestamp")
def land(rows: pd.DataFrame, state: pd.DataFrame, ctx: KeyGroupContext) -> KeyGroupResult:
    """A head stage that passes events on and keeps no state."""
    return KeyGroupResult(output=rows[["word", "ts"]])


def zone_job(bronze: Path, base: Path) -> Job:
    """bronze ─► zones (timestamps in state and sink) and ─► sessions (event-time timeouts)."""
    config = AbsConfig(key_groups=2, commit_mode="sync", local_state_dir=str(base / "local"))

    def stage(name: str, source: Any, operator: Any, **more: Any) -> Pipeline:
        root = base / "stages" / name
        return Pipeline(
            name, source, operator, root=str(root), sinks=str(base / name), config=config, **more
        )

    head = stage("bronze", DeltaSource(str(bronze), max_files_per_trigger=1), land)
    zones = stage("zones", head.channel(), latest)
    gaps = stage(
        "sessions",
        head.channel(),
        sessions,
        transform=lambda df: df.withWatermark("ts", "300 days"),  # the events' months vary
    )
    return Job("zones", str(base), [head, zones, gaps])


@pytest.mark.parametrize("zone", ["America/New_York"], indirect=True)
def test_a_downstream_job_stage_keeps_every_instant_and_event_time_in_another_zone(
    spark: SparkSession, tmp_path: Path, zone: str
) -> None:
    """Timestamps through a channel, and event-time timeouts in a downstream stage, in New
    York: what Spark computes in the zone, what the same job gives in UTC, and again after a
    job rollback. Two late epochs move the watermark past every 2026 session."""
    bronze = tmp_path / "bronze"
    late = [
        [("z", dt.datetime(2027, 12, 1, tzinfo=UTC))],
        [("z", dt.datetime(2027, 12, 2, tzinfo=UTC))],
    ]
    write_bronze(bronze, [*EPOCHS, *late])
    job = zone_job(bronze, tmp_path / "ny")
    job.run()
    want_sink, want_state = expected(spark, bronze, len(EPOCHS))
    last = len(EPOCHS) - 1
    assert_df_equality(
        job.sink("zones", epoch=last), want_sink, ignore_row_order=True, ignore_nullable=True
    )
    assert_df_equality(
        job.state("zones", last), want_state, ignore_row_order=True, ignore_nullable=True
    )

    def rows(job: Job, stage: str, epoch: int | None = None) -> list[tuple[Any, ...]]:
        return sorted(map(tuple, job.state(stage, epoch).collect()))

    ny = {s.epoch: rows(job, "sessions", s.epoch) for s in job.snapshots()}
    assert [w for w, *_ in ny[max(ny)]] == ["z"], "every 2026 session timed out"
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    utc_job = zone_job(bronze, tmp_path / "utc")
    utc_job.run()
    assert {s.epoch: rows(utc_job, "sessions", s.epoch) for s in utc_job.snapshots()} == ny
    spark.conf.set("spark.sql.session.timeZone", zone)
    job.rollback(1)
    job.run()
    assert rows(job, "sessions") == ny[max(ny)]
    assert rows(job, "zones") == rows(utc_job, "zones")
