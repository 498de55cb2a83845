"""The word count run by a session whose Python workers Spark does not reuse.

``python -m tests.support.unreused_workers INPUTS ROOT`` runs the word count (its output rows
carrying their worker's frozen-object count) over ``INPUTS`` into ``ROOT`` with
``spark.python.worker.reuse=false``: every task gets a fresh Python worker.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark_abs import local_session
from tests.support.pipelines import word_count_seeing_the_heap, word_pipeline


def main(inputs: str, root: str) -> int:
    local_session("unreused-workers", conf={"spark.python.worker.reuse": "false"})
    word_pipeline(Path(inputs), Path(root), op=word_count_seeing_the_heap).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
