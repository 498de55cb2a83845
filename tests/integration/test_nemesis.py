"""A short nemesis schedule: lifecycle operations against one pipeline, checked after each.

``scripts/harnesses/nemesis.py`` runs every pipeline operation in a child process (this process starts
no Spark), and checks every retained snapshot of every root against its reference model after
each step. Each pipeline run costs a child's Spark start (15 to 40 s on a loaded two-core
machine), so the schedule is short: seed 92 draws a kill, two restores, a rollback, a run
with compaction and vacuum beside it, and a paused zombie. The kinds are drawn with their
own generator, so they stay the same whatever the runs do, except that a restore or
rollback before the first snapshot becomes a run. Vacuums beside the run use
``min_age_seconds=0`` and on-demand compaction races the run's background compaction: the
schedule that found those two holes (files of the epoch in flight deleted; a snapshot
compacted twice) before they were closed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts" / "harnesses"))

import nemesis

OPS = 6
KINDS = {"kill", "maintenance", "zombie"}


def test_a_short_schedule_loses_doubles_and_resurrects_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--ops", str(OPS), "--seed", "92", "--root", str(tmp_path / "n")]
    report = nemesis.main(argv)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == report
    assert sum(report["ops"].values()) == OPS
    assert set(report["ops"]) >= KINDS, report["ops"]
    assert len(report["ops"]) >= 4, report["ops"]
    assert report["epochs"] >= 3
    counts = {name: report[name] for name in nemesis.COUNTS}
    assert counts == dict.fromkeys(nemesis.COUNTS, 0), report
    assert nemesis.sound(report)
