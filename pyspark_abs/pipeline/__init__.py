"""The pipeline layer: the declaration, its wiring into Spark, back-edges and Spark Connect."""
