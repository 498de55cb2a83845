"""Savepoints (rollback, restore, written state), compaction, retention and validation."""
