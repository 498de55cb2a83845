"""Pipelines and jobs through Spark Connect: pyspark's own Connect server, a crash, rollback,
restore, a job started streaming, and a TTL operator in another session time zone."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from pyspark_abs import Snapshots
from pyspark_abs.errors import FencingError
from pyspark_abs.protocol.lease import Lease, read_lease
from tests.support.inputs import EPOCHS
from tests.support.jobs import FILES, assert_job_matches, job_of
from tests.support.pipelines import assert_same, expected_state
from tests.support.ttl import BATCHES, as_frame, model, state_of, watermarks_of

REPO = Path(__file__).parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server started from pyspark's own jars, on local[2]."""
    port = free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    command = [
        str(spark_submit),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master",
        "local[2]",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=2",
        "--conf",
        "spark.sql.session.timeZone=UTC",
        "--conf",
        f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile={REPO / 'conf/log4j2.properties'}",
        "spark-internal",
    ]
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
    }
    with log.open("w") as out:
        server = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 180
        while not listening(port):
            try:
                server.wait(timeout=0.5)
                pytest.fail(f"the Spark Connect server exited: {log.read_text()[-3000:]}")
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"no Spark Connect server on port {port}: {log.read_text()[-3000:]}"
                    )
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=60)
        # a Python worker the server's JVM started may outlive it: end what is left of its group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)


def client_report(module: str, connect_url: str, workdir: Path) -> dict[str, Any]:
    """Run the client program ``tests.integration.<module>`` against the server, in a process
    of its own (a Connect session switches pyspark into Connect mode for the whole process),
    and return the JSON object it printed last, which says it ran over Connect."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", f"tests.integration.{module}", connect_url, str(workdir)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-5000:]
    report: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["session"] == "pyspark.sql.connect.session"
    return report


def test_crash_rollback_and_restore_through_spark_connect(
    spark: SparkSession, connect_url: str, tmp_path: Path
) -> None:
    report = client_report("connect_run", connect_url, tmp_path)
    assert "commit_mode='sync'" in report["async_refused"]
    assert "cannot run over Spark Connect" in report["kafka_sink_refused"]
    assert report["crash"] == "InjectedFault"
    assert report["recovered_epochs"] == [1]
    assert report["latest_epoch"] == len(EPOCHS) - 1
    assert report["rollback_epoch"] == len(EPOCHS)
    assert report["after_rollback_epochs_run"] == len(EPOCHS) - 2
    assert report["copy_epochs_run"] == len(EPOCHS) - 2

    for root in ("root", "copy"):
        snapshots = Snapshots(str(tmp_path / root), spark)
        assert_same(snapshots.state("word_count"), expected_state(spark, EPOCHS))
        assert_same(snapshots.state("word_count", 1), expected_state(spark, EPOCHS[:2]))


def test_a_job_started_streaming_through_spark_connect_gives_the_model(
    spark: SparkSession, connect_url: str, tmp_path: Path
) -> None:
    """On fresh checkpoints the later stages wait for their first epoch; once every stage
    continues its checkpoint, every stage starts at once; the job snapshots are those the
    input files give."""
    report = client_report("connect_job", connect_url, tmp_path)
    assert "gold" in report["waiting_at_first_start"]  # its upstream has committed nothing
    assert report["waiting_at_second_start"] == []
    assert_job_matches(spark, job_of(spark, tmp_path), {n: n for n in range(len(FILES))})


def test_a_ttl_operator_rolled_back_through_spark_connect_in_another_time_zone_gives_the_model(
    spark: SparkSession, connect_url: str, tmp_path: Path
) -> None:
    """Event times reach the server's Python workers as Kolkata wall-clock times; every
    expiry is still an instant, so the run after the rollback (in the Arrow form) lapses keys
    as the model."""
    report = client_report("connect_ttl", connect_url, tmp_path)
    assert report["zone"] == "Asia/Kolkata"
    # batches 0 and 1 and an epoch without rows; after the rollback batches 1 to 3 and one
    assert report["epochs_run"] == [3, 4]
    snapshots = Snapshots(str(tmp_path / "root"), spark)
    epochs = [i.epoch for i in snapshots.list()]
    assert min(epochs[-4:]) > report["rollback_epoch"]
    expected = model(BATCHES, watermarks_of(BATCHES))
    for epoch, state in zip([0, *epochs[-4:]], expected, strict=True):
        assert_same(state_of(snapshots, epoch), as_frame(spark, state))


@pytest.mark.compat
def test_the_server_side_run_holds_the_lease_after_its_client_dies(
    connect_url: str, tmp_path: Path
) -> None:
    """The process that writes holds the root: a dead client's root is not taken over."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "tests.integration.connect_run", connect_url, str(tmp_path)]
    client = subprocess.Popen(
        [*command, "--serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert client.stdout is not None
        served = json.loads(client.stdout.readline())
    finally:
        client.kill()
        client.wait()
    root = served["root"]
    holder = read_lease(root)
    assert holder is not None
    assert holder.pid != served["client_pid"]

    with pytest.raises(FencingError, match="cannot start"):
        Lease.acquire(root, "connect", "a-second-start")
    write_deltalake(served["words"], pa.table({"word": ["late", "late"]}), mode="append")
    deadline = time.monotonic() + 180
    while not [s for s in Snapshots(root).list() if s.epoch >= 1]:
        assert time.monotonic() < deadline, (
            "the server-side run committed no epoch after the client died"
        )
        time.sleep(0.5)
    assert read_lease(root) is not None
