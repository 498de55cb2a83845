"""The declaration, its start in named steps, the run handle, rollback and restore of its root."""
