"""An example spark-submit job: the snapshotted word count over a directory of text files.

The files are read with a ``FileSource``, one per epoch, so the root can be rolled back and
restored. pyspark-abs must be installed in the Python that ``PYSPARK_PYTHON`` names (Spark's
Python data source workers import it from there; ``--py-files`` does not reach them)::

    PYSPARK_PYTHON=$(which python) spark-submit --master 'local[2]' \\
        --properties-file conf/spark-defaults.conf \\
        scripts/examples/spark_submit_job.py --input DIR --root DIR [--config conf/pipeline.toml]

Settings come from ``--config`` (the ``[abs]`` table of a TOML file) or else from the
``spark.abs.*`` keys of the properties file. The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from pyspark.sql import SparkSession

import pyspark_abs
from pyspark_abs import AbsConfig, FileSource, Pipeline, Snapshots
from pyspark_abs.examples import wordcount


def main(argv: Sequence[str] | None = None) -> int:
    """Run the word count over ``--input`` until every file is processed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="directory of text files")
    parser.add_argument("--root", required=True, help="snapshot root")
    parser.add_argument("--config", help="TOML file with an [abs] table")
    args = parser.parse_args(argv)
    spark = SparkSession.builder.appName("pyspark-abs-wordcount").getOrCreate()
    config = AbsConfig.from_file(args.config) if args.config else AbsConfig.from_spark_conf(spark)
    Pipeline(
        "wordcount",
        FileSource(args.input, "text", max_files_per_trigger=1),
        wordcount.word_count,
        root=args.root,
        sinks={"output": f"{args.root}/sinks/word_counts"},
        config=config,
        transform=wordcount.words_of,
    ).run()
    epochs = [info.epoch for info in Snapshots(args.root).list()]
    summary = {"epochs": epochs, "pyspark_abs": pyspark_abs.__file__, "config": str(config)}
    print(json.dumps(summary))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
