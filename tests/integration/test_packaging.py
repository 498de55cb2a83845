"""Installs as users make them, in new virtual environments built offline from this one.

Databricks puts its PySpark on the path without pip metadata; a package that required
``pyspark`` would make pip install another one over it. A classic installation
(``pyspark-abs[spark]``) has none of Spark Connect's client packages.
"""

from __future__ import annotations

import email
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.inputs import EPOCHS, write_epochs
from tests.support.venvs import runtime_venv

REPO = Path(__file__).parents[2]


def test_the_wheel_leaves_the_runtime_pyspark_in_place(tmp_path: Path) -> None:
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(tmp_path / "dist"), str(REPO)], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("pyspark_abs-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(archive.read(name))
    requirements = metadata.get_all("Requires-Dist") or []
    needs_pyspark = [r for r in requirements if re.match(r"pyspark\b(?!-)", r)]
    assert needs_pyspark == ['pyspark<5,>=4.0; extra == "spark"'], needs_pyspark

    python, venv_site = runtime_venv(tmp_path, left_out=())
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    assert "Successfully installed pyspark-abs-" in install.stdout
    assert "pyspark-4" not in install.stdout
    where = subprocess.check_output(
        [
            str(python),
            "-c",
            "import pyspark, pyspark_abs; print(pyspark.__file__, pyspark_abs.__file__)",
        ],
        text=True,
        cwd=tmp_path,
    ).split()
    assert where[0] == str(tmp_path / "runtime" / "pyspark" / "__init__.py")
    assert where[1].startswith(str(venv_site))


CONNECT_CLIENT = ("grpc", "google", "protobuf", "zstandard", "googleapis")


def test_a_classic_installation_runs_a_pipeline_without_spark_connect_packages(
    tmp_path: Path,
) -> None:
    python, venv_site = runtime_venv(tmp_path, left_out=CONNECT_CLIENT)
    (venv_site / "project.pth").write_text(f"{REPO}\n")
    missing = subprocess.run([str(python), "-c", "import grpc"], capture_output=True)
    assert missing.returncode != 0, "the environment must not have Spark Connect's client"
    inputs = write_epochs(tmp_path / "in", EPOCHS)
    root = tmp_path / "root"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=str(python),
        PYSPARK_SUBMIT_ARGS=f"--properties-file {REPO / 'conf' / 'spark-defaults.conf'} pyspark-shell",
    )
    job = [str(REPO / "scripts" / "examples" / "spark_submit_job.py"), "--input", str(inputs)]
    run = subprocess.run(
        [str(python), *job, "--root", str(root), "--config", str(REPO / "conf" / "pipeline.toml")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["epochs"] == list(range(len(EPOCHS)))
