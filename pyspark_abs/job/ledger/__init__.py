"""A job's records: its manifest of decisions, the links of its stages and its snapshots.

The lowest floor of the Job feature: the restore machinery reads it to tell a job's stage
from a lone pipeline.
"""
