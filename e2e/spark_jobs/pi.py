"""Test-only PySpark job of the end-to-end tests: estimates pi on the executors and prints which
hosts did the work, so the test can tell that executor pods (not the driver) ran the tasks."""

from __future__ import annotations

import random
import socket
import sys

from pyspark.sql import SparkSession


def inside(_: int) -> int:
    x, y = random.random(), random.random()
    return 1 if x * x + y * y <= 1 else 0


def main() -> None:
    samples = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    spark = SparkSession.builder.appName("tidalmq-e2e-pi").getOrCreate()
    sc = spark.sparkContext
    rdd = sc.parallelize(range(samples), 8)
    hits = rdd.map(inside).sum()
    hosts = sorted(set(rdd.mapPartitions(lambda _: [socket.gethostname()]).collect()))
    print(f"PI_ESTIMATE {4.0 * hits / samples:.4f}")
    print(f"DRIVER_HOST {socket.gethostname()}")
    print(f"EXECUTOR_HOSTS {','.join(hosts)}")
    spark.stop()


if __name__ == "__main__":
    main()
