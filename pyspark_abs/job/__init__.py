"""Jobs: several pipelines joined by channels, snapshotted as one consistent cut."""
