"""Write rows 0..ROWS-1 to a Kafka topic, as a job submitted to a Spark cluster, through
``pidctl-kafka`` or Spark's own Kafka sink (``--format kafka``, with spark-sql-kafka-0-10 on
``--jars``): the same job for both, so their counts can be set side by side.

    spark-submit --master spark://HOST:7077 kafka_write.py --kafka broker:9092 --topic t \\
        --pidctl 127.0.0.1:9093 --rows 20000 [--format kafka] [--app-id nightly --version 7]

Each row's value is ``<id>:<padding>`` and its key the id: a consumer counts duplicates and
missing rows by the id. ``--slow-ms`` sleeps that long per ``--batch-rows`` rows (so a test
can kill something mid-write); ``--straggler P`` makes partition P's first attempt 5x
slower (so speculation copies it); ``--attempts-dir`` records each task attempt and how many
batches it has passed on to the sink so far. Prints one JSON line: the format, the rows and
the seconds the write took.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession


def slowed(slow_ms: int, straggler: int, attempts_dir: str | None) -> Any:
    """A pass-through over Arrow batches that sleeps ``slow_ms`` per batch (5x as long in the
    straggler partition's first attempt), and leaves a file ``<partition>-<attempt>`` in
    ``attempts_dir`` for every task attempt (the cluster is one machine: what retried),
    holding the number of batches the sink has taken from it so far and the host of its
    executor (so a fault can be timed, and aimed, to land mid-write)."""

    def passthrough(batches: Iterator[Any]) -> Iterator[Any]:
        import os
        from pathlib import Path

        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        marker = None
        if attempts_dir:
            marker = Path(attempts_dir, f"{context.partitionId()}-{context.attemptNumber()}")
            marker.write_text("0")
        host = os.environ.get("SPARK_LOCAL_IP", "")  # a worker's own, inherited
        pause = slow_ms / 1000
        if context.partitionId() == straggler and context.attemptNumber() == 0:
            pause *= 5
        for taken, batch in enumerate(batches, start=1):
            time.sleep(pause)
            yield batch
            if marker:  # the sink asked for the next batch: it has this one
                marker.write_text(f"{taken} {host}")

    return passthrough


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kafka", required=True, help="kafka.bootstrap.servers")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--pidctl", help="pidctl's HOST:PORT (pidctl-kafka)")
    parser.add_argument(
        "--format",
        default="pidctl-kafka",
        choices=["pidctl-kafka", "kafka", "write_kafka"],
        help="a data source, or write_kafka (pidctl-kafka from the driver)",
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--app-id", help="txnAppId (pidctl-kafka)")
    parser.add_argument("--version", help="txnVersion (pidctl-kafka)")
    parser.add_argument("--slow-ms", type=int, default=0)
    parser.add_argument("--batch-rows", type=int, help="Arrow batch rows (default Spark's, 10,000)")
    parser.add_argument("--straggler", type=int, default=-1)
    parser.add_argument("--attempts-dir", help="a file per task attempt goes here")
    args = parser.parse_args()

    builder = SparkSession.builder.appName(f"pidctl-kafka-write-{args.format}")
    if args.batch_rows:
        builder = builder.config("spark.sql.execution.arrow.maxRecordsPerBatch", args.batch_rows)
    spark = builder.getOrCreate()
    if args.format == "pidctl-kafka":  # Spark's own sink needs no registration
        from pidctl.spark import register_data_sources

        register_data_sources(spark)
    df = spark.range(0, args.rows, 1, args.partitions)
    if args.slow_ms:
        df = df.mapInArrow(slowed(args.slow_ms, args.straggler, args.attempts_dir), df.schema)
    df = df.selectExpr(
        "CAST(id AS STRING) AS key", "CONCAT(CAST(id AS STRING), ':', REPEAT('x', 100)) AS value"
    )
    options = {"kafka.bootstrap.servers": args.kafka, "topic": args.topic}
    if args.format != "kafka":
        options["pidctl.bootstrap"] = args.pidctl
        if args.app_id:
            options |= {"txnAppId": args.app_id, "txnVersion": args.version}
        else:
            options["delivery"] = "at-least-once"
    started = time.perf_counter()
    if args.format == "write_kafka":
        from pidctl.spark import write_kafka

        write_kafka(df, options)
    else:
        df.write.format(args.format).mode("append").options(**options).save()
    seconds = time.perf_counter() - started
    print(json.dumps({"format": args.format, "rows": args.rows, "write_s": round(seconds, 3)}))
    spark.stop()


if __name__ == "__main__":
    main()
