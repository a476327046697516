"""The asyncio Kafka listener, connection handling and request dispatch."""
