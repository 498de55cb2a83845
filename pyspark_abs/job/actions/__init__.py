"""What a job does to its stages' roots: decisions, rollbacks, restores, migrations, names.

Above the restore machinery it drives, below the pipeline that settles a stage's part of a
decision when it starts.
"""
