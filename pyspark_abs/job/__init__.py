"""Jobs: several pipelines joined by channels, snapshotted as one consistent cut.

The Job feature sits in three folders side by side, one floor each: ``job_ledger`` (the
job's records, which the restore machinery reads), ``job_actions`` (what a job does to its
stages' roots, which a starting stage uses) and this one, above the pipeline: the
:class:`~pyspark_abs.job.declaration.Job` declaration and its running
:class:`~pyspark_abs.job.query.JobQuery`.
"""
