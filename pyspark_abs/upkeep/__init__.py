"""Upkeep the user runs on a root: compaction, retention, validation and savepoint names."""
