"""Kafka API handlers, one module per API family."""
