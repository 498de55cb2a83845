"""spark-submit with the built wheel on a local master, as the README documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from tests.support.inputs import EPOCHS, write_epochs
from tests.support.pipelines import assert_word_counts

REPO = Path(__file__).parents[2]


def test_spark_submit_runs_the_example_job_from_the_wheel(
    spark: SparkSession, tmp_path: Path
) -> None:
    dist = tmp_path / "dist"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "-q", "-w", str(dist), str(REPO)], check=True, timeout=300)
    (wheel,) = dist.glob("pyspark_abs-*.whl")
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    command = [
        str(submit),
        "--master",
        "local[2]",
        "--py-files",
        str(wheel),
        "--properties-file",
        str(REPO / "conf" / "spark-defaults.conf"),
        str(REPO / "scripts" / "spark_submit_job.py"),
        "--input",
        str(inputs),
        "--root",
        str(root),
        "--config",
        str(REPO / "conf" / "pipeline.toml"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    # from another working directory: nothing in the command or the conf is relative to it
    run = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["pyspark_abs"].startswith(str(wheel)), summary
    assert summary["epochs"] == list(range(len(EPOCHS)))
    assert_word_counts(spark, root, EPOCHS)
