"""Stream storage on object storage: object-store backends, WAL flushes, partition logs, compaction."""
