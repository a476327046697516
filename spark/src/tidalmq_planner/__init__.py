"""The TidalMQ planner: Prometheus traffic history to balanced reassignment plans, on Spark.

Run it
    tidalmq plan --prometheus http://prometheus:9090 [--window 7d] [--step 1m]
                 [--bootstrap-server HOST:PORT] [--threshold 1.1] [--max-moves N]
                 [--out plan.json] [--report-dir DIR]
    tidalmq plan --history saved.parquet --brokers 0,1,2,3 --out plan.json   (offline)
Spark runs in local mode (`--master local[N]`); on Kubernetes the operator submits `job.py` to
Spark-on-Kubernetes (tidalmq_operator.planning). Exit status 0: the plan reaches the threshold;
3: it does not (budget spent, or no move helps); 2: bad arguments.

What it reads (exported by every broker for the partitions it leads, labels broker, topic,
partition): `tidalmq_partition_bytes_in_total`, `tidalmq_partition_bytes_out_total`,
`tidalmq_partition_leader_epoch` (the current assignment, when no bootstrap server is given),
and `tidalmq_partitions_led` (live brokers, including one that just joined).

Modules
    history      the history table (one row per partition, rates on a time grid), durations
    prometheus   range queries as Spark tasks, the current assignment from Prometheus
    assignment   the current assignment from Kafka metadata, the controller, or a file
    profiles     per-partition load profiles (numpy in Spark's Python workers)
    job          the Spark job and the driver-side balancing (tidalmq_core.balance_load)
    report       plan, rollback, PartitionReassignment YAML, table, JSON, PNG chart
    publish      the result as a ConfigMap, from a driver pod
    synthetic    synthetic history with skew and daily seasonality (benchmark, tests)

The balancing itself is tidalmq_core.balance.balance_load, next to the controller's
balance_counts; this package imports nothing else of TidalMQ.
"""
