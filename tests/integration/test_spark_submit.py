"""spark-submit on a local master, as the documentation shows, and ``--py-files`` refused clearly.

Spark's Python data source workers (a ``FileSource`` here) import pyspark-abs by name with
the Python ``PYSPARK_PYTHON`` names; a wheel shipped with ``--py-files`` does not reach them.
"""

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
from tests.support.venvs import runtime_venv

REPO = Path(__file__).parents[2]
SUBMIT = Path(pyspark.__file__).parent / "bin" / "spark-submit"


def submit(python: Path, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """spark-submit the example job over EPOCHS from another working directory."""
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    command = [
        str(SUBMIT),
        "--master",
        "local[2]",
        *options,
        "--properties-file",
        str(REPO / "conf" / "spark-defaults.conf"),
        str(REPO / "scripts" / "examples" / "spark_submit_job.py"),
        "--input",
        str(inputs),
        "--root",
        str(tmp_path / "root"),
        "--config",
        str(REPO / "conf" / "pipeline.toml"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYSPARK_PYTHON=str(python), PYSPARK_DRIVER_PYTHON=str(python))
    # nothing in the command or the conf is relative to the working directory
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )


def test_spark_submit_runs_the_example_job_with_the_package_installed(
    spark: SparkSession, tmp_path: Path
) -> None:
    run = submit(Path(sys.executable), tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["epochs"] == list(range(len(EPOCHS)))
    assert_word_counts(spark, tmp_path / "root", EPOCHS)


def test_a_wheel_in_py_files_that_the_workers_python_lacks_is_refused_with_how_to_install(
    tmp_path: Path,
) -> None:
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(tmp_path / "dist"), str(REPO)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("pyspark_abs-*.whl")
    python, _ = runtime_venv(tmp_path / "env", left_out=())
    bare = subprocess.run(
        [str(python), "-c", "import pyspark_abs"], capture_output=True, cwd=tmp_path
    )
    assert bare.returncode != 0, "the cluster's Python must not have pyspark-abs"

    run = submit(python, tmp_path, "--py-files", str(wheel))
    assert run.returncode != 0
    output = run.stdout + run.stderr  # spark-submit passes the driver's stderr on to stdout
    assert "ConfigError: FileSource(" in output, output[-3000:]
    assert f"import pyspark-abs with {python} (PYSPARK_PYTHON)" in output
    assert f"--py-files ({wheel}) does not reach those workers" in output
    assert f"{python} -m pip install pyspark-abs" in output
    assert not (tmp_path / "root").exists(), "nothing may run before the refusal"
