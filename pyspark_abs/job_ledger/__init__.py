"""A job's records: its manifest of decisions, the links of its stages and its snapshots.

The Job feature's lowest floor (see :mod:`pyspark_abs.job`): the restore machinery reads it to
tell a job's stage from a lone pipeline.
"""
