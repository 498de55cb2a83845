"""Run the word count, and the medallion job where the Spark runs it, once over tiny files,
so that a JVM started with ``-XX:ArchiveClassesAtExit`` archives the classes a pipeline loads
(Spark's session, streaming, Python and Arrow paths). scripts/_jvm.sh runs it once per venv;
every JVM of a test run then maps those classes in place of loading and verifying them
again, which takes about half off starting a session and its first query. The medallion job
reads with a Python data source's read limit, which Spark 4.0 and 4.1 do not have.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from pyspark_abs import Snapshots, local_session
from pyspark_abs.examples import medallion, wordcount
from pyspark_abs.runtime import python_source_problem


def main() -> None:
    """Run the pipelines, read their state with Spark, and stop the session (the JVM exits)."""
    spark = local_session("archive classes", shuffle_partitions=2)
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "words").mkdir()
        (Path(work) / "words" / "a.txt").write_text("to be or not to be\n")
        wordcount.build(f"{work}/words", f"{work}/wordcount").run()
        Snapshots(f"{work}/wordcount", spark).state("word_count").toPandas()
        if python_source_problem(spark.version, "a read limit", "") is None:
            medallion.write_events(f"{work}/in", [[("e1", "ann", 5)], [("e2", "bob", 7)]])
            job = medallion.build(spark, f"{work}/in", f"{work}/job")
            job.run()
            job.state("gold").toPandas()
    spark.stop()


if __name__ == "__main__":
    main()
