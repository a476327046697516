"""Kafka wire codec: framing, request/response (de)serialisation via kio, record batch headers. No I/O."""
