"""A short job nemesis schedule: job operations with every feature, checked after each step.

``scripts/harnesses/job_nemesis.py`` runs every job operation in a child process (this process starts
no Spark) and checks every stage snapshot of every job root against its reference model
(``scripts/harnesses/job_model.py``, deltalake and pyarrow only), every listed job snapshot for a
consistent cut, the stages' savepoint names, and validate. Each run costs a child's Spark
start, so the schedule is short. Then the model is told of an input file that never landed:
the same check must find the job's snapshots wrong.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts" / "harnesses"))

import job_nemesis

OPS = 6
SEED = 82  # draws each of the kinds once
KINDS = ["kill", "crashed_rollback", "write_state", "tag", "delete", "migrate"]


def test_a_short_job_schedule_loses_doubles_and_resurrects_nothing(tmp_path: Path) -> None:
    nemesis = job_nemesis.run_schedule(tmp_path / "n", SEED, KINDS, OPS)
    report = nemesis.report(SEED, 0.0)
    assert sum(report["ops"].values()) == OPS
    assert set(report["ops"]) == set(KINDS), report["ops"]
    killed = [o for o in report["outcomes"] if o.startswith("kill:") and o.endswith(":killed")]
    assert killed, f"the kill never killed a run: {report['outcomes']}"
    counts = {name: report[name] for name in job_nemesis.COUNTS}
    assert counts == dict.fromkeys(job_nemesis.COUNTS, 0), report
    assert job_nemesis.sound(report)

    nemesis.inputs[0] = []  # the model no longer knows the first file's events
    nemesis.check(OPS + 2, "planted")
    assert nemesis.counts["mismatches"] > 0
    assert not job_nemesis.sound(nemesis.report(SEED, 0.0))
