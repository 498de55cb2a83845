"""The declaration, its wiring into Spark, the run handle, back-edges and Connect."""
