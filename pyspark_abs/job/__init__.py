"""Jobs: several pipelines joined by channels, snapshotted as one consistent cut.

The whole Job feature, on three floors: ``ledger`` (the job's records, read by the restore
machinery), ``actions`` (what a job does to its stages' roots, used by a starting stage) and,
above the pipeline, the :class:`~pyspark_abs.job.declaration.Job` declaration and its
running :class:`~pyspark_abs.job.query.JobQuery`.
"""
