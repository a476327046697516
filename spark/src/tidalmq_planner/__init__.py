"""The TidalMQ planner: Prometheus traffic history to balanced reassignment plans, on Spark."""
