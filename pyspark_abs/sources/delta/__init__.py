"""The Delta source: a Delta table read as a replayable stream, and Spark's own Delta reader."""
