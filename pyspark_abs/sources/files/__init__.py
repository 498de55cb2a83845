"""The file source: a directory of files read as a replayable stream; Spark's own file reader."""
