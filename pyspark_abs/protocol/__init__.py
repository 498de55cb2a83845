"""Barriers, pre-commit, alignment, the two-phase commit, recovery, lease, compaction.

The coordinator drives one epoch: tasks pre-commit files and barrier markers, the driver
aligns them, records PREPARED, commits the tables and records COMMITTED (the epoch writer,
in order through the committer), compacting in the background. A lease fences other runs.
"""
