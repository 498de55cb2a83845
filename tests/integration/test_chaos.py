"""Short chaos runs: the word count killed three times, the medallion job twice; both exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def test_killed_and_restarted_pipeline_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(REPO / "scripts" / "harnesses" / "chaos.py"),
        "--kills",
        "3",
        "--seed",
        "7",
    ]
    command += ["--root", str(tmp_path / "root")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0, f"{report}\n{run.stderr[-3000:]}"
    assert report["kills"] == 3
    assert report["epochs"] >= 5
    assert (report["missing_epochs"], report["unread_files"]) == ([], 0)
    assert (report["lost_rows"], report["duplicated_rows"], report["state_mismatches"]) == (0, 0, 0)
    assert report["validate_problems"] == []
    assert report["errors"] == []


def test_killed_and_restarted_job_keeps_every_job_snapshot_a_true_cut(tmp_path: Path) -> None:
    command = [
        sys.executable,
        str(REPO / "scripts" / "harnesses" / "chaos.py"),
        "--kills",
        "2",
        "--seed",
        "3",
    ]
    command += ["--root", str(tmp_path / "job"), "--job"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0, f"{report}\n{run.stderr[-3000:]}"
    assert report["kills"] == 2
    assert report["job_snapshots"] >= 3
    assert (report["unread_files"], report["state_mismatches"]) == (0, 0)
    assert report["validate_problems"] == []
    assert report["errors"] == []
