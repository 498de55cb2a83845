"""What runs on every supported Spark (4.0 to 4.3), and what is refused before 4.2.

These tests are the compatibility subset (marker ``compat``): ``scripts/test_spark_versions``
runs them, with the core pipeline, crash and recovery tests, on each Spark version.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_abs import ChannelSource, DeltaSource, FileSource, Snapshots, restore, rollback
from pyspark_abs.errors import SparkVersionError
from pyspark_abs.examples import wordcount
from pyspark_abs.manifest.entries import EpochStatus
from tests.support.docs import docs_text
from tests.support.inputs import EPOCHS, write_epochs
from tests.support.pipelines import OP, assert_same, counts_df, word_table
from tests.support.versions import files_pipeline, older, shuffle_partitions, word_count_arrow

pytestmark = pytest.mark.compat


@pytest.mark.parametrize("form", ["pandas", "arrow"])
def test_a_file_source_rolls_back_and_restores_at_another_scale_as_an_uninterrupted_run(
    spark: SparkSession, tmp_path: Path, form: str
) -> None:
    """In both vectorized forms; the uninterrupted run stays in the pandas form, so in the
    Arrow form the copy restored from it continues a pandas root in the Arrow form."""
    landing, root, clean = tmp_path / "landing", tmp_path / "root", tmp_path / "clean"
    op = word_count_arrow if form == "arrow" else wordcount.word_count
    write_epochs(landing, EPOCHS[:2])
    files_pipeline(root, landing, operator=op).run()
    files_pipeline(clean, landing).run()
    write_epochs(landing, EPOCHS[2:], first=2)
    files_pipeline(root, landing, operator=op).run()
    files_pipeline(clean, landing).run()
    snapshots = Snapshots(str(root), spark)
    assert [s.epoch for s in snapshots.list()] == [0, 1]
    assert_same(snapshots.state(OP, 0), counts_df(spark, EPOCHS[:2]))

    rolled = rollback(str(root), 0)
    assert (rolled.epoch, rolled.status, rolled.restored_from) == (2, EpochStatus.RESTORED, 0)
    files_pipeline(root, landing, operator=op).run()
    uninterrupted = Snapshots(str(clean), spark)
    assert_same(snapshots.state(OP), uninterrupted.state(OP))
    assert_same(snapshots.state(OP), counts_df(spark, EPOCHS))
    assert_same(snapshots.sink("output"), uninterrupted.sink("output"))

    copy = tmp_path / "copy"
    restore(str(clean), 0, str(copy))
    with shuffle_partitions(spark, 3):
        files_pipeline(copy, landing, key_groups=5, operator=op).run()
    restored = Snapshots(str(copy), spark)
    assert [s.epoch for s in restored.list()] == [0, 1]
    assert_same(restored.state(OP), uninterrupted.state(OP))
    after_snapshot = uninterrupted.sink("output").subtract(uninterrupted.sink("output", 0))
    assert_same(restored.sink("output"), after_snapshot)


def test_read_limits_and_channels_need_spark_4_2_and_are_refused_before_anything_runs(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = write_epochs(tmp_path / "landing", EPOCHS[:1])
    words = word_table(tmp_path / "words", EPOCHS[:1])
    upstream = files_pipeline(tmp_path / "up", landing)
    loads: dict[str, Callable[[], FileSource | DeltaSource | ChannelSource]] = {
        "FileSource": lambda: FileSource(str(landing), "text", max_files_per_trigger=1),
        "DeltaSource": lambda: DeltaSource(words, max_rows_per_trigger=5),
        "ChannelSource": lambda: upstream.channel("output"),
    }
    if older(spark):
        with pytest.raises(SparkVersionError) as refused:
            FileSource("/landing/clicks", "text", max_files_per_trigger=1).load(spark)
        shown = f"SparkVersionError: {refused.value}".replace(spark.version, "4.1.4")
        assert f"```text\n{shown}\n```" in docs_text(), "the documentation shows this error"
    for name, source in loads.items():
        if older(spark):
            with pytest.raises(SparkVersionError, match=rf"^{name}\(.* needs Spark 4\.2 "):
                source().load(spark)
        else:
            assert source().load(spark).isStreaming, name
