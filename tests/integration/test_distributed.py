"""Exactly once on a real multi-process cluster: pre-commit files come from executor processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_word_count_is_exactly_once_on_a_local_cluster(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    command = [sys.executable, "-m", "tests.integration.distributed_run", str(tmp_path)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    tasks = json.loads(run.stdout.strip().splitlines()[-1])["tasks_by_executor"]
    workers = {executor: count for executor, count in tasks.items() if executor != "driver"}
    assert len(workers) == 2
    assert all(count > 0 for count in workers.values()), tasks
