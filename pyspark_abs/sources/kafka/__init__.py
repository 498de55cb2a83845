"""The Kafka source: topics read with Spark's Kafka connector, rewindable to a snapshot."""
