"""A first pipeline: a word count whose state and outputs are snapshotted at every epoch."""

import tempfile
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pyspark_abs import AbsConfig, KeyState, Pipeline, SparkFileSource, local_session, operator


@operator(key="word", state_schema="count long", output_schema="word string, count long")
def word_count(key: tuple[str], rows: pd.DataFrame, state: KeyState) -> dict[str, object]:
    """Count a word's rows; emit the word's count so far."""
    count = state.get({"count": 0})["count"] + len(rows)
    state.update({"count": count})
    return {"word": key[0], "count": count}


def words(lines: DataFrame) -> DataFrame:
    """One row per word of each line."""
    return lines.select(F.explode(F.split("value", " ")).alias("word"))


spark = local_session()  # or your own SparkSession
base = Path(tempfile.mkdtemp())
(base / "in").mkdir()
(base / "in" / "0.txt").write_text("to be or not to be")


def word_counts(config: AbsConfig | None = None) -> Pipeline:
    """The word count over the landed files, snapshotted under ``base/abs``."""
    lines = SparkFileSource(f"{base}/in", "text", options={"maxFilesPerTrigger": "1"})
    return Pipeline(
        "wordcount", lines, word_count, transform=words, root=f"{base}/abs",
        sinks=f"{base}/tables", config=config or AbsConfig(),
    )  # fmt: skip


pipeline = word_counts()
pipeline.run()  # epoch 0: its state and outputs are committed together, exactly once
pipeline.snapshots.state("word_count").show()  # to 2, be 2, or 1, not 1
