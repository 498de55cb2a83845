"""What the tests need to know of the Spark they run on, and a pipeline every Spark runs."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pyspark_abs import (
    AbsConfig,
    FileSource,
    Operator,
    Pipeline,
    arrow_operator,
)
from pyspark_abs.examples import wordcount
from tests.support.inputs import count_words_arrow, write_epochs

OLDER = ("4.0", "4.1")


def older(spark: SparkSession) -> bool:
    """Whether the session runs Spark 4.0 or 4.1 (no read limits for Python data sources)."""
    return spark.version.startswith(OLDER)


word_count_arrow = arrow_operator(
    key="word",
    state_schema="count long",
    output_schema="word string, count long",
    name="word_count",
)(count_words_arrow)
"""The example's word count in the Arrow form."""


def files_pipeline(
    root: Path, landing: Path, *, key_groups: int = 8, operator: Operator = wordcount.word_count
) -> Pipeline:
    """The word count over the text files in ``landing`` with a ``FileSource`` without limits."""
    return Pipeline(
        "wordcount",
        FileSource(str(landing), "text"),
        operator,
        root=str(root),
        sinks={"output": sink_of(root)},
        config=AbsConfig(key_groups=key_groups, commit_mode="sync"),
        transform=wordcount.words_of,
    )


def sink_of(root: Path) -> str:
    """The sink of :func:`files_pipeline` at ``root``."""
    return f"{root}/sinks/word_counts"


def land_and_run(landing: Path, root: Path, texts: Sequence[str], first: int = 0) -> None:
    """Land ``texts`` as files numbered from ``first``, then run :func:`files_pipeline`."""
    write_epochs(landing, texts, first=first)
    files_pipeline(root, landing).run()


@contextmanager
def shuffle_partitions(spark: SparkSession, count: int) -> Iterator[None]:
    """Run the block with ``count`` shuffle partitions (a restore at another scale)."""
    before = spark.conf.get("spark.sql.shuffle.partitions") or "200"
    spark.conf.set("spark.sql.shuffle.partitions", str(count))
    try:
        yield
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)


def as_batched(spark: SparkSession, rewound: DataFrame, expected: DataFrame) -> list[DataFrame]:
    """The two word-count sinks to compare: as they are, or each word's last count on 4.0/4.1.

    There, the first ``availableNow`` run after a rewind reads the whole backlog in one
    micro-batch (Spark falls back to one batch when a source, here the restore rows', is a
    Python data source), so the intermediate counts of one-file epochs are not written.
    """
    if not older(spark):
        return [rewound, expected]
    return [f.groupBy("word").agg(F.max("count").alias("count")) for f in (rewound, expected)]
