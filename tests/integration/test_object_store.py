"""Roots on an S3 API (moto's server on 127.0.0.1): what delta-rs lists, pyarrow reads, the
manifest's compare-and-swap, a pipeline's whole lifecycle with everything on S3, two racing
runs, a killed job, a decided epoch whose sink file was deleted, and a Kafka sink whose table
is on S3."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql.datasource import CaseInsensitiveDict

from pyspark_abs import DeltaSource, EpochStatus, Snapshots, rollback
from pyspark_abs.cli import main
from pyspark_abs.errors import ConcurrentWriteError, ConfigError, FencingError, SourceError
from pyspark_abs.examples import medallion, wordcount
from pyspark_abs.faults import EXIT_CODE
from pyspark_abs.protocol.lease import break_lease, read_lease
from pyspark_abs.sources.delta.stream import DeltaDataSource
from pyspark_abs.sources.readers import ReadAllAvailable
from pyspark_abs.storage.root import SnapshotRoot
from pyspark_abs.storage.store import DeltaStore, TableSpec
from pyspark_abs.upkeep.validation import validate
from tests.support.children import paused_child
from tests.support.inputs import EPOCHS, arrow_schema, running_counts, write_epochs
from tests.support.jobs import FILES, job_of
from tests.support.kafka import BROKER, KAFKA_JARS, committed_records, kafka_broker
from tests.support.pipelines import OP, assert_same
from tests.support.s3 import land, s3_environment, s3_server, spark_s3_arguments
from tests.support.versions import files_pipeline

REPO = Path(__file__).parents[2]
S3_JARS = "ABS_S3_JARS"

BUCKET = "abs-roots"
SCHEMA = arrow_schema(("epoch", pa.int64()), ("word", pa.string()))


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local S3 server with a bucket, the environment pointing delta-rs and pyarrow at it."""
    with s3_server(tmp_path_factory.mktemp("s3")) as found, pytest.MonkeyPatch.context() as env:
        for name, value in s3_environment(found).items():
            env.setenv(name, value)
        pafs.S3FileSystem(endpoint_override=found, allow_bucket_creation=True).create_dir(BUCKET)
        yield found


@pytest.fixture
def bucket(endpoint: str) -> str:
    """The bucket's URI."""
    return f"s3://{BUCKET}"


@pytest.mark.parametrize("conditional_put", ["etag", None])
def test_a_table_on_s3_is_read_back_and_its_compare_and_swap_holds(
    bucket: str, conditional_put: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With delta-rs's conditional put set, and without it (S3's own If-None-Match)."""
    if conditional_put is None:
        monkeypatch.delenv("AWS_CONDITIONAL_PUT")
    store, uri = DeltaStore(), f"{bucket}/{conditional_put}/_manifest"
    store.ensure_table(TableSpec("_manifest", uri, SCHEMA))
    first = pa.table({"epoch": [0, 0], "word": ["a", "b"]}, schema=SCHEMA)
    second = pa.table({"epoch": [1], "word": ["c"]}, schema=SCHEMA)
    store.append(uri, first)
    rows, version = store.read_versioned(uri)
    assert rows.sort_by("word").equals(first)
    assert store.append(uri, second, expected_version=version) == version + 1
    with pytest.raises(ConcurrentWriteError):
        store.append(uri, second, expected_version=version)
    assert store.read(uri).sort_by("word").equals(pa.concat_tables([first, second]))
    assert store.read(uri, version=version, columns=["word"]).column("word").to_pylist() in (
        ["a", "b"],
        ["b", "a"],
    )


def spark_on_s3(endpoint: str) -> dict[str, str]:
    """The environment of a child whose Spark keeps ``s3://`` paths on the local server."""
    if not os.environ.get(S3_JARS):
        pytest.skip("no Hadoop S3A jars (scripts/test fetches them)")
    arguments = spark_s3_arguments(endpoint, os.environ[S3_JARS])
    return {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_SUBMIT_ARGS": arguments}


def s3_program(endpoint: str, module: str, *args: str) -> Any:
    """Run ``module`` as its own program with Spark on the local S3 server; its JSON report."""
    run = subprocess.run(
        [sys.executable, "-m", module, *args],
        env=spark_on_s3(endpoint),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_pipeline_with_everything_on_s3_lives_through_its_lifecycle_as_an_uninterrupted_run(
    spark: SparkSession, endpoint: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Landing files, root, sinks, Spark's checkpoint and a restored copy on S3: a crash after
    PREPARED, a named savepoint, compaction, a rollback to the savepoint, a run on empty local
    disks (the live state rebuilt from S3), a restore at other partition and key-group counts,
    vacuum and validate (tests/integration/s3_run.py); then the command line reads the root."""
    out, bucket = tmp_path / "out", f"s3://{BUCKET}/lifecycle"
    report = s3_program(endpoint, "tests.integration.s3_run", bucket, str(out))
    assert report["recovered"] == [1]
    assert report["problems"] == []
    assert report["compacted"] == [["state/word_count", 2]]
    assert report["expired"]
    assert {1, report["newest"]}.isdisjoint(report["expired"])
    assert report["deleted"] > 0
    assert report["rebuilt_files"] > 0

    clean, landing = tmp_path / "clean", tmp_path / "landing"
    for i in range(len(EPOCHS[:4])):
        write_epochs(landing, EPOCHS[i : i + 1], first=i)
        files_pipeline(clean, landing).run()
    uninterrupted = Snapshots(str(clean), spark)
    read = spark.read.parquet
    assert_same(read(str(out / "root_state")), uninterrupted.state(OP))
    assert_same(read(str(out / "root_sink")), uninterrupted.sink("output"))
    after_two = uninterrupted.sink("output").subtract(uninterrupted.sink("output", 1))
    assert_same(read(str(out / "copy_state")), uninterrupted.state(OP))
    assert_same(read(str(out / "copy_sink")), after_two)

    root = f"{bucket}/root"
    cli = {
        name: (main([name, root, *args, "--json"]), json.loads(capsys.readouterr().out))
        for name, *args in (("snapshots",), ("describe", "two"), ("state", OP, "--limit", "99"))
    }
    assert {status for status, _ in cli.values()} == {0}
    assert cli["snapshots"][1][-1]["epoch"] == report["newest"]
    assert cli["describe"][1]["epoch"] == 1
    assert cli["describe"][1]["tags"] == ["two"]
    printed = spark.createDataFrame(cli["state"][1], "word string, count long")
    assert_same(printed, uninterrupted.state(OP))
    assert main(["validate", root]) == 0


def test_a_kafka_sink_whose_table_is_on_s3_publishes_each_committed_row_once(
    spark: SparkSession, endpoint: str, tmp_path: Path
) -> None:
    """The outbox table, root and checkpoint on S3, a real broker: a run that fails during
    the publication of epoch 1 leaves it committed and unpublished, and the next start
    publishes it once; a read_committed consumer sees the uninterrupted run's sink."""
    if not os.environ.get(BROKER) or not os.environ.get(KAFKA_JARS):
        pytest.skip("no Kafka broker jars (scripts/test fetches them)")
    command = [sys.executable, "-m", "tests.integration.s3_kafka_run", f"s3://{BUCKET}/kafka"]
    (tmp_path / "kafka").mkdir()
    with kafka_broker(Path(os.environ[BROKER]), tmp_path / "kafka") as servers:
        run = subprocess.run(
            [*command, servers, "counts"],
            env=spark_on_s3(endpoint),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        records = committed_records(servers, "counts")
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["committed_at_failure"] == 1
    assert report["epochs"] == [0, 1, 2]
    clean, landing = tmp_path / "clean", tmp_path / "landing"
    for i in range(3):
        write_epochs(landing, EPOCHS[i : i + 1], first=i)
        files_pipeline(clean, landing).run()
    uninterrupted = Snapshots(str(clean), spark).sink("output")
    rows = [(key, json.loads(value)["count"]) for key, value, _ in records]
    assert_same(spark.createDataFrame(rows, "word string, count long"), uninterrupted)
    assert {epoch for *_, epoch in records} == {0, 1, 2}


def test_of_two_runs_on_an_s3_root_the_one_that_lost_it_commits_nothing(
    endpoint: str, tmp_path: Path
) -> None:
    """The example word count on S3, paused after PREPARED of epoch 1, holds the root's lease:
    a rollback is refused. Once the lease is broken a second run takes over and commits the
    PREPARED epoch; resumed, the first is fenced. Every epoch is committed once."""
    env, bucket = spark_on_s3(endpoint), f"s3://{BUCKET}/race"
    for index in range(len(EPOCHS)):
        land(bucket, index)
    root, log = f"{bucket}/root", tmp_path / "zombie.log"
    command = [
        sys.executable,
        "-m",
        "pyspark_abs.examples.wordcount",
        "--input",
        f"{bucket}/landing",
    ]
    command += ["--root", root, "--key-groups", "8", "--commit-mode", "sync"]
    zombie = paused_child([*command, "--pause", "after_prepared:1"], env, log)
    try:
        holder = read_lease(SnapshotRoot(root))
        assert holder is not None
        assert holder.pid == zombie.pid
        with pytest.raises(FencingError, match=rf"held by run {holder.run_id} .* is refused"):
            rollback(root, 0)
        break_lease(SnapshotRoot(root))
        taker = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert taker.returncode == 0, taker.stderr[-4000:]
        assert "recovery committed PREPARED epoch(s) [1]" in taker.stdout
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        zombie.wait(timeout=300)
    assert zombie.returncode != 0
    assert f"run {holder.run_id} of pipeline 'wordcount' no longer holds" in log.read_text()
    statuses = [s.status for s in Snapshots(root).list(include_aborted=True)]
    assert statuses == [EpochStatus.COMMITTED] * len(EPOCHS)
    state = Snapshots(root).state_table(OP).to_pylist()
    assert {r["word"]: r["count"] for r in state} == running_counts(EPOCHS)[0]
    assert validate(root) == []


def test_a_job_on_s3_killed_mid_epoch_recovers_as_the_uninterrupted_job(
    spark: SparkSession, endpoint: str, tmp_path: Path
) -> None:
    """The medallion job with its input, stages' roots and channels on S3, its application
    killed after PREPARED of silver's epoch 1 and started again as streaming queries (the
    stages that continue their checkpoints at once), against the same job run uninterrupted
    on local paths: the same job snapshots and every stage's state."""
    env, bucket = spark_on_s3(endpoint), f"s3://{BUCKET}/medallion"
    medallion.write_events(tmp_path / "in", FILES[:3])
    fs, base = pafs.FileSystem.from_uri(f"{bucket}/in")
    for event_file in sorted((tmp_path / "in").iterdir()):
        with fs.open_output_stream(f"{base}/{event_file.name}") as out:
            out.write(event_file.read_bytes())
    command = [sys.executable, "-m", "pyspark_abs.examples.medallion", "--input", f"{bucket}/in"]
    command += ["--root", f"{bucket}/job"]
    crashed = subprocess.run(
        [*command, "--crash", "silver:after_prepared:1"], env=env, capture_output=True, timeout=600
    )
    assert crashed.returncode == EXIT_CODE, crashed.stderr.decode()[-4000:]
    rerun = subprocess.run([*command, "--streaming"], env=env, capture_output=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr.decode()[-4000:]
    started = "stages waiting for their upstream stages at the start: []"  # all continue
    assert started in rerun.stdout.decode(), rerun.stdout.decode()

    uninterrupted = job_of(spark, tmp_path, key_groups=8)  # the program's
    uninterrupted.run()
    on_s3 = medallion.build(spark, f"{bucket}/in", f"{bucket}/job")
    assert on_s3.snapshots() == uninterrupted.snapshots()
    rows = 0
    for name, stage in uninterrupted.stages.items():
        for operator in Snapshots(stage.root).operators():
            s3_state, local_state = (
                sorted_rows(Snapshots(s.root).state_table(operator))
                for s in (on_s3.stages[name], stage)
            )
            assert s3_state.equals(local_state), f"{name}: {s3_state} != {local_state}"
            rows += local_state.num_rows
    assert rows > 0


def test_a_decided_epoch_on_s3_whose_sink_file_was_deleted_is_replaced_by_a_rollback(
    endpoint: str,
) -> None:
    """Epoch 1 fails after PREPARED, then a file it wrote to the sink is deleted from the
    bucket (tests/integration/s3_stuck_run.py): the next start refuses with what to do,
    validate lists it, a rollback replaces it, and the pipeline then gives the model's
    counts and sink rows."""
    bucket = f"s3://{BUCKET}/stuck"
    report = s3_program(endpoint, "tests.integration.s3_stuck_run", bucket)
    root, lost = f"{bucket}/root", report["lost"]
    assert f"epoch 1 can never be committed: its file {lost}" in report["refusal"]
    assert f"pyspark_abs.rollback('{root}', 0)" in report["refusal"]
    assert report["problems"] == [
        f"epoch 1: decided (PREPARED) but no start can commit it: its file {lost} of "
        f"sink/output at {root}/sinks/word_counts is gone"
    ]
    assert report["replaced"] == EpochStatus.ABORTED.value
    counts, emitted = running_counts(EPOCHS)
    assert {r["word"]: r["count"] for r in report["state"]} == counts
    assert sorted((r["word"], r["count"]) for r in report["sink"]) == sorted(emitted)
    assert report["problems_after"] == []


def sorted_rows(table: pa.Table) -> pa.Table:
    """The rows of ``table`` in the order of all its columns."""
    return table.sort_by([(column, "ascending") for column in table.column_names])


def test_a_root_on_s3_without_spark_s3_support_is_refused_with_what_to_add(
    spark: SparkSession, bucket: str, tmp_path: Path
) -> None:
    """The session has no S3A: the checkpoint under the root cannot live on S3."""
    landing, root = tmp_path / "landing", f"{bucket}/no-s3a"
    write_epochs(landing, EPOCHS[:1])
    pipeline = wordcount.build(str(landing), root)
    with pytest.raises(ConfigError, match=r"no file system for s3://.*fs\.s3\.impl"):
        pipeline.run()
    assert Snapshots(root).list(include_aborted=True) == []
    assert read_lease(SnapshotRoot(root)) is None


def test_a_delta_source_whose_store_goes_away_names_the_table(tmp_path: Path) -> None:
    """Probing for the next version of a table on an object store that stopped answering is
    a SourceError naming the table, as listing its log is, not pyarrow's bare OSError."""
    with pytest.MonkeyPatch.context() as env:
        with s3_server(tmp_path) as found:
            for name, value in s3_environment(found).items():
                env.setenv(name, value)
            pafs.S3FileSystem(endpoint_override=found, allow_bucket_creation=True).create_dir(
                "gone"
            )
            table = "s3://gone/events"
            write_deltalake(table, pa.table({"id": [1, 2]}))
            source = DeltaSource(table)
            data_source = DeltaDataSource(CaseInsensitiveDict(source._options()))
            reader = data_source.streamReader(data_source.schema())
            start = reader.initialOffset()
            assert reader.latestOffset(start, ReadAllAvailable()) != start
        with pytest.raises(SourceError, match=r"Delta table s3://gone/events") as raised:
            reader.latestOffset(start, ReadAllAvailable())
        assert "retry" in str(raised.value)
