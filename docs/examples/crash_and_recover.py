"""The first pipeline dies in the middle of an epoch, starts again, then rolls back."""

import contextlib

from chispa import assert_df_equality
from first_pipeline import base, spark, word_counts  # runs the first pipeline: epoch 0

from pyspark_abs import AbsConfig, rollback
from pyspark_abs.errors import InjectedFault
from pyspark_abs.faults import Fault, FaultStep

(base / "in" / "1.txt").write_text("to do is to be")
crash = AbsConfig(faults=(Fault(FaultStep.AFTER_PREPARED, epoch=1),))
with contextlib.suppress(InjectedFault):  # dies after deciding epoch 1, before committing it
    word_counts(crash).run()
pipeline = word_counts()
pipeline.run()  # commits epoch 1 once: nothing lost, nothing counted twice
counts = [("to", 4), ("be", 3), ("or", 1), ("not", 1), ("do", 1), ("is", 1)]
expected = spark.createDataFrame(counts, "word string, count long")
state = pipeline.snapshots.state("word_count")
assert_df_equality(state, expected, ignore_row_order=True, ignore_nullable=True)

rollback(f"{base}/abs", 0)  # state, sinks and source offsets back to epoch 0
pipeline.run()  # reads 1.txt again: the same counts, each output row once
state = pipeline.snapshots.state("word_count")
assert_df_equality(state, expected, ignore_row_order=True, ignore_nullable=True)
