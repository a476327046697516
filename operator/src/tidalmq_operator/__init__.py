"""The TidalMQ Kubernetes operator (Kopf): Topic, PartitionReassignment and StaticTopic resources
reconciled by the shared controller code."""
