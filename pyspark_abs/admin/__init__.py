"""The admin layer: savepoints (rollback, restore, written state), compaction, retention, checks."""
