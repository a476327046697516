"""Apache Kafka assembled from Maven Central, as TidalMQ's yardstick (see harness.py)."""
