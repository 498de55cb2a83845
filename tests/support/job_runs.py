"""The medallion job with silver redeployed (``dedup_v2``), run as its own application.

``python -m tests.support.job_runs BASE STAGE:STEP:EPOCH`` runs the job over ``BASE/in`` with
its root at ``BASE/job`` and exits the process (a crash, skipping all cleanup) when STAGE
reaches STEP of EPOCH.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark_abs import AbsConfig, local_session
from pyspark_abs.examples import medallion
from pyspark_abs.faults import Fault, FaultAction, FaultStep
from tests.support.jobs import dedup_v2


def main(base: str, crash: str) -> int:
    stage, step, epoch = crash.split(":")
    spark = local_session("job-runs", shuffle_partitions=2)
    fault = Fault(FaultStep(step), int(epoch), FaultAction.EXIT)
    config = AbsConfig(key_groups=4, commit_mode="sync")
    medallion.build(
        spark,
        str(Path(base) / "in"),
        str(Path(base) / "job"),
        config=config,
        stage_configs={stage: AbsConfig(key_groups=4, commit_mode="sync", faults=(fault,))},
        operators={"silver": dedup_v2},
    ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
