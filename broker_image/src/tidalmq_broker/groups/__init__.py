"""The group coordinator: consumer groups and committed offsets, durable in __consumer_offsets."""
