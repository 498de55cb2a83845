"""Run the medallion job once over two tiny files, so that a JVM started with
``-XX:ArchiveClassesAtExit`` archives the classes a pipeline loads (Spark's session,
streaming, Python and Arrow paths). scripts/_jvm.sh runs it once per venv; every JVM of a
test run then maps those classes in place of loading and verifying them again, which takes
about half off starting a session and its first query.
"""

from __future__ import annotations

import tempfile

from pyspark_abs import local_session
from pyspark_abs.examples import medallion


def main() -> None:
    """Run the job, read its state with Spark, and stop the session (the JVM exits)."""
    spark = local_session("archive classes", shuffle_partitions=2)
    with tempfile.TemporaryDirectory() as work:
        medallion.write_events(f"{work}/in", [[("e1", "ann", 5)], [("e2", "bob", 7)]])
        job = medallion.build(spark, f"{work}/in", f"{work}/job")
        job.run()
        job.state("gold").toPandas()
    spark.stop()


if __name__ == "__main__":
    main()
