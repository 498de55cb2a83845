"""The snapshots layer: reading a root's epochs, state, sinks and metrics."""
