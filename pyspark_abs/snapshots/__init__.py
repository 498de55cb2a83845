"""Reading a root's epochs, state, sinks, back-edge records and metrics."""
