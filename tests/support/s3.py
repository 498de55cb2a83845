"""A local S3 API (moto's server on 127.0.0.1), started and stopped within bounded times."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs as pafs

from pyspark_abs import AbsConfig, DeltaSink, FileSource, Pipeline
from pyspark_abs.errors import InjectedFault
from pyspark_abs.examples import wordcount
from pyspark_abs.faults import Fault, FaultStep
from tests.support.docs import block_with
from tests.support.inputs import EPOCHS
from tests.support.servers import free_port, serving

START_SECONDS = 30


@contextmanager
def s3_server(workdir: Path) -> Iterator[str]:
    """Run moto's S3 server on a free local port; yield its endpoint URL."""
    port = free_port()
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with serving(command, port, workdir / "moto.log", START_SECONDS):
        yield f"http://127.0.0.1:{port}"


def s3_environment(endpoint: str) -> dict[str, str]:
    """What delta-rs and pyarrow need in the environment to use the local server."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_CONDITIONAL_PUT": "etag",
    }


def spark_s3_arguments(endpoint: str, jars: str) -> str:
    """``PYSPARK_SUBMIT_ARGS`` for a Spark that keeps ``s3://`` paths on the local server
    through Hadoop's S3A (``jars``: hadoop-aws and the AWS SDK modules it uses): the
    documentation's settings, and those it gives for an S3-compatible store."""
    readme = block_with("spark.hadoop.fs.s3.impl", "bash")
    settings = dict(re.findall(r"--conf (\S+?)=(\S+)", readme))
    assert settings, "the documentation's S3 block sets no --conf"
    settings["spark.hadoop.fs.s3a.endpoint"] = endpoint
    settings["spark.hadoop.fs.s3a.path.style.access"] = "true"
    confs = " ".join(f"--conf {key}={value}" for key, value in settings.items())
    return f"--jars {jars} {confs} pyspark-shell"


def land(bucket: str, index: int) -> None:
    """Put EPOCHS[index] into the bucket's ``landing`` directory as its own file."""
    fs, path = pafs.FileSystem.from_uri(f"{bucket}/landing/part-{index:04d}.txt")
    with fs.open_output_stream(path) as out:
        out.write(EPOCHS[index].encode())


def pipeline(
    bucket: str,
    root: str,
    *,
    key_groups: int = 8,
    crash: int | None = None,
    step: FaultStep = FaultStep.AFTER_PREPARED,
    local_state_dir: str = "",
    sink: DeltaSink | None = None,
) -> Pipeline:
    """The word count over the bucket's landing directory into ``sink`` (by default the
    table ``sinks/word_counts`` under the root); ``crash``: an epoch that fails at ``step``."""
    faults = () if crash is None else (Fault(step, epoch=crash),)
    return Pipeline(
        "wordcount",
        FileSource(f"{bucket}/landing", "text"),
        wordcount.word_count,
        root=root,
        sinks={"output": sink or f"{root}/sinks/word_counts"},
        config=AbsConfig(
            key_groups=key_groups,
            commit_mode="sync",
            faults=faults,
            local_state_dir=local_state_dir,
        ),
        transform=wordcount.words_of,
    )


def crashed_after_prepared(bucket: str, root: str) -> None:
    """Land the first two files: epoch 0 commits, epoch 1 fails after PREPARED."""
    land(bucket, 0)
    pipeline(bucket, root).run()
    land(bucket, 1)
    try:
        pipeline(bucket, root, crash=1).run()
        raise AssertionError("the crash after PREPARED of epoch 1 did not happen")
    except InjectedFault:
        pass
