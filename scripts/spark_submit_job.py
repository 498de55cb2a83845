"""An example spark-submit job: the snapshotted word count over a directory of text files.

Ship pyspark-abs as a wheel with ``--py-files`` (executors then also need pandas, pyarrow and
deltalake in the Python that ``PYSPARK_PYTHON`` names)::

    python -m pip wheel --no-deps -w dist .
    PYSPARK_PYTHON=$(which python) spark-submit --master 'local[2]' \\
        --py-files dist/pyspark_abs-0.1.0-py3-none-any.whl \\
        --properties-file conf/spark-defaults.conf \\
        scripts/spark_submit_job.py --input DIR --root DIR [--config conf/pipeline.toml]

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
from pyspark_abs import AbsConfig, Snapshots
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
    wordcount.build(spark, args.input, args.root, config=config).run()
    epochs = [info.epoch for info in Snapshots(args.root).list()]
    summary = {"epochs": epochs, "pyspark_abs": pyspark_abs.__file__, "config": str(config)}
    print(json.dumps(summary))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
