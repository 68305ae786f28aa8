"""Benchmark: ``format("pidctl-kafka")`` against Spark's own Kafka sink, same job, same broker,
measured in the same run.

    python -m ops.bench.spark_kafka [--rows 400000] [--partitions 4] [--wide-partitions 1000]

- Throughput without faults: the same DataFrame (a string key, a 100-byte value) written by
  ``format("kafka")`` (spark-sql-kafka-0-10 4.2.0, from Maven Central) and by
  ``format("pidctl-kafka")`` into fresh topics of one real broker, alternately, best of
  ``--repeats``; the ratio is pidctl's rows/s over Spark's. CPU seconds of the Spark process
  tree (driver JVM and Python workers) and of the broker are printed for each.
- The broker's producer-state count after a job of ``--wide-partitions`` Spark partitions
  (DescribeProducers over every partition of the topic), for both sinks: pidctl-kafka holds
  one PID per Spark partition and Kafka partition written, Spark's sink one per executor.

- With ``--faults``: both sinks under each fault of ops/testing/spark_kafka_faults.py on a
  standalone master with two workers (executor killed, worker killed, speculation, driver
  killed and re-run): rows, duplicates and missing, counted by id with a consumer.

Prints one JSON object. Needs the ``spark`` extra and Java 17; the jars come from
``python -m ops.testing.jars``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ops.testing.jars import classpath
from ops.testing.kafka import KafkaNode
from ops.testing.kafka_topics import count, new_topic
from ops.testing.serverproc import ServerProcess
from ops.testing.spark_cluster import SparkCluster
from ops.testing.spark_kafka_faults import FAULTS, SINKS, KafkaFaults, report
from pidctl.spark.kafka_cluster import KafkaCluster

#: The PID range the docs recommend for a pidctl serving jobs: far above a Kafka controller's.
JOB_RANGE_START = 2**62
VALUE_BYTES = 100
#: A busy machine (other suites running) took longer than ServerProcess's 20 s to start one.
SERVER_START_TIMEOUT_S = 180.0


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and of its children it has waited for (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime, stime, cutime, cstime: fields 14-17 of stat, 11-14 after the command.
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and every live descendant."""
    total = 0.0
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    stack = [pid]
    while stack:
        current = stack.pop()
        total += process_cpu_seconds(current)
        stack.extend(children.get(current, []))
    return total


def session(jars: str) -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from pidctl.spark import register_data_sources

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("pidctl-bench-kafka")
        .config("spark.jars", jars)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register_data_sources(spark)
    return spark


def frame(spark: Any, rows: int, partitions: int) -> Any:
    return spark.range(0, rows, 1, partitions).selectExpr(
        "CAST(id AS STRING) AS key",
        f"CONCAT(CAST(id AS STRING), ':', REPEAT('x', {VALUE_BYTES})) AS value",
    )


def write(df: Any, fmt: str, kafka: KafkaNode, pidctl: ServerProcess, topic: str) -> None:
    writer = (
        df.write.format(fmt)
        .mode("append")
        .option("kafka.bootstrap.servers", kafka.bootstrap)
        .option("topic", topic)
    )
    if fmt == "pidctl-kafka":
        writer = writer.option("pidctl.bootstrap", pidctl.bootstrap)
        writer = writer.option("partitions", str(max(1000, df.rdd.getNumPartitions())))
    writer.save()


def timed(
    spark: Any, df: Any, fmt: str, kafka: KafkaNode, pidctl: ServerProcess, partitions: int
) -> dict[str, Any]:
    topic = new_topic(kafka.bootstrap, partitions, prefix=fmt)
    me, broker = os.getpid(), kafka.pid
    cpu0, broker0, t0 = tree_cpu_seconds(me), process_cpu_seconds(broker), time.perf_counter()
    write(df, fmt, kafka, pidctl, topic)
    elapsed = time.perf_counter() - t0
    rows = df.count()
    return {
        "topic": topic,
        "seconds": elapsed,
        "rows_per_s": rows / elapsed,
        "spark_cpu_s": tree_cpu_seconds(me) - cpu0,
        "broker_cpu_s": process_cpu_seconds(broker) - broker0,
    }


def producer_states(kafka: KafkaNode, topic: str, partitions: int) -> int:
    cluster = KafkaCluster([kafka.bootstrap], client_id="bench", timeout_s=60, connection={})
    try:
        found = cluster.describe_producers((topic, p) for p in range(partitions))
    finally:
        cluster.close()
    return sum(len(states) for states in found.values())


def throughput(
    spark: Any, kafka: KafkaNode, pidctl: ServerProcess, args: argparse.Namespace
) -> dict[str, Any]:
    """Both sinks on the same job, alternately, best of ``--repeats``; every row counted."""
    df = frame(spark, args.rows, args.partitions)
    write(frame(spark, 1000, 2), "kafka", kafka, pidctl, new_topic(kafka.bootstrap, 1))
    write(frame(spark, 1000, 2), "pidctl-kafka", kafka, pidctl, new_topic(kafka.bootstrap, 1))
    runs: dict[str, list[dict[str, Any]]] = {"kafka": [], "pidctl-kafka": []}
    for _ in range(args.repeats):
        for fmt in runs:
            runs[fmt].append(timed(spark, df, fmt, kafka, pidctl, args.partitions))
    best = {fmt: max(r, key=lambda x: x["rows_per_s"]) for fmt, r in runs.items()}
    for run in best.values():
        counted = count(kafka.bootstrap, run["topic"], args.rows)
        run["duplicates"], run["missing"] = counted.duplicates, counted.missing
    return {
        "spark_kafka_sink": best["kafka"],
        "pidctl_kafka": best["pidctl-kafka"],
        "ratio": best["pidctl-kafka"]["rows_per_s"] / best["kafka"]["rows_per_s"],
        "all_runs": runs,
    }


def wide_job(
    spark: Any, kafka: KafkaNode, pidctl: ServerProcess, args: argparse.Namespace
) -> dict[str, Any]:
    """Producer states on the broker after a job of ``--wide-partitions`` partitions."""
    wide: dict[str, Any] = {
        "spark_partitions": args.wide_partitions,
        "kafka_partitions": args.wide_topic_partitions,
    }
    for fmt in ("kafka", "pidctl-kafka"):
        topic = new_topic(kafka.bootstrap, args.wide_topic_partitions, prefix="wide")
        df = frame(spark, args.wide_partitions * 20, args.wide_partitions)
        write(df, fmt, kafka, pidctl, topic)
        wide[fmt] = producer_states(kafka, topic, args.wide_topic_partitions)
    return wide


def fault_comparison(
    kafka: KafkaNode, pidctl: ServerProcess, faults: list[str], sinks: list[str]
) -> list[dict[str, Any]]:
    """The sinks under the faults, on one standalone cluster; each run is also printed to
    stderr as it ends (a long run's partial result)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    runs = []
    with SparkCluster(env={"PATH": path}) as cluster:
        harness = KafkaFaults(cluster, kafka, pidctl)
        for fault in faults:
            for sink in sinks:
                runs.append(harness.run(fault, sink))
                partial(f"fault {fault} {sink}", report(runs[-1:])[0])
    return report(runs)


def partial(what: str, value: Any) -> None:
    """A section's result on stderr as soon as it is measured."""
    print(f"# {what}: {json.dumps(value)}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def started(server: ServerProcess) -> Iterator[ServerProcess]:
    """The server started with a patient timeout, killed at the end."""
    server.start(timeout=SERVER_START_TIMEOUT_S)
    try:
        yield server
    finally:
        server.kill()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=4, help="Spark and Kafka partitions")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--wide-partitions", type=int, default=1000)
    parser.add_argument("--wide-topic-partitions", type=int, default=4)
    parser.add_argument("--faults", action="store_true", help="also the fault comparison")
    parser.add_argument("--fault-list", default=",".join(FAULTS), help="faults to run")
    parser.add_argument("--fault-sinks", default=",".join(SINKS), help="sinks under faults")
    parser.add_argument("--skip-throughput", action="store_true")
    args = parser.parse_args(argv)
    jars = classpath("spark-kafka").replace(os.pathsep, ",")
    result: dict[str, Any] = {"rows": args.rows, "value_bytes": VALUE_BYTES}
    with (
        tempfile.TemporaryDirectory(prefix="pidctl-bench-kafka-") as tmp,
        KafkaNode(shipped_jvm=True) as kafka,
        started(
            ServerProcess(Path(tmp) / "data", "--first-producer-id", str(JOB_RANGE_START))
        ) as pidctl,
    ):
        spark = session(jars)
        try:
            if not args.skip_throughput:
                result |= throughput(spark, kafka, pidctl, args)
                partial("throughput", {k: v for k, v in result.items() if k != "all_runs"})
            if args.wide_partitions:
                result["producer_states"] = wide_job(spark, kafka, pidctl, args)
                partial("producer_states", result["producer_states"])
        finally:
            spark.stop()
        if args.faults:
            faults, sinks = args.fault_list.split(","), args.fault_sinks.split(",")
            result["faults"] = fault_comparison(kafka, pidctl, faults, sinks)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
