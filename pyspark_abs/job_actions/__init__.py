"""What a job does to its stages' roots: decisions, rollbacks, restores, migrations, names.

The Job feature's middle floor (see :mod:`pyspark_abs.job`): above the restore machinery it
drives, below the pipeline that settles a stage's part of a decision when it starts.
"""
