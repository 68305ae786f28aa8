"""Exactly once you can watch: Spark's own Kafka sink and ``pidctl-kafka`` under the same
fault, side by side, on this machine.

    ops/dev.sh demo            (= python -m ops.demo [--rows 20000])

Starts everything it needs on loopback, on free ports, and stops it all at the end:

1. a real Apache Kafka node (KRaft, from the jars ``ops/dev.sh fetch`` put in Maven's cache);
2. a pidctl granting from 2^62 up, a PID range apart from anything Kafka's own controller
   hands out (a partition leader accepts any PID it has never seen, so the two must never
   meet: docs/spark-kafka.md);
3. a Spark standalone master and two workers;

then, for each sink, creates a fresh topic and submits the same job
(``ops/spark/examples/kafka_write.py``: ``--rows`` rows, each its unique id, in 4 Spark
partitions into 4 Kafka partitions), SIGKILLs the executor JVMs once a tenth of the rows are
in Kafka and a task is mid-write (Spark retries the killed tasks on the executors its
workers start again), and counts the topic's rows by id with a consumer. Prints the two
counts side by side. A few minutes on a laptop; more on a busy machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from ops.testing.kafka import KafkaNode
from ops.testing.serverproc import ServerProcess
from ops.testing.spark_cluster import SparkCluster
from ops.testing.spark_kafka_faults import FaultRun, KafkaFaults, min_rows

#: The first PID of the demo's pidctl: docs/spark-kafka.md's range for a pidctl serving jobs.
SAFE_FIRST_PRODUCER_ID = 2**62
#: A busy machine took longer than ServerProcess's default to start one.
START_TIMEOUT_S = 180.0
SINKS = {"kafka": 'Spark\'s format("kafka")', "pidctl-kafka": 'format("pidctl-kafka")'}


def say(line: str) -> None:
    print(line, flush=True)


def table(runs: list[FaultRun], rows: int) -> list[str]:
    """The side-by-side counts, one line each."""
    lines = [
        f"{rows:,} rows written by each sink; the executors killed mid-write",
        "",
        f"{'sink':<28} {'rows in the topic':>18} {'written twice':>14} {'missing':>8}",
    ]
    for run in runs:
        name = SINKS[run.sink]
        lines.append(f"{name:<28} {run.rows:>18,} {run.duplicates:>14,} {run.missing:>8,}")
    return lines


def side_by_side(kafka: KafkaNode, pidctl: ServerProcess, rows: int) -> list[FaultRun]:
    """Each sink's job on one standalone cluster, its executors killed mid-write."""
    # The executors' Python is this one (pidctl and pyspark installed), as on a cluster
    # where pidctl is installed on every machine (docs/spark-deployment.md).
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    say("starting a Spark standalone master and two workers ...")
    runs = []
    with SparkCluster(env={"PATH": path}) as cluster:
        harness = KafkaFaults(cluster, kafka, pidctl, rows=rows)
        for sink, name in SINKS.items():
            say(f"writing {rows:,} rows with {name}; its executors killed mid-write ...")
            runs.append(harness.run("executors", sink))
            run = runs[-1]
            say(
                f"  done in {run.seconds:.0f} s (exit {run.exit_codes[-1]}): "
                f"{run.executors_killed} executors killed, {run.extra_attempts} tasks run again"
            )
    return runs


def main(argv: list[str] | None = None) -> list[FaultRun]:
    parser = argparse.ArgumentParser(
        prog="ops/dev.sh demo", description=__doc__.splitlines()[0], epilog=__doc__
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=20_000,
        help=f"rows per job (default 20000, at least {min_rows()})",
    )
    args = parser.parse_args(argv)
    if args.rows < min_rows():
        parser.error(f"--rows {args.rows}: at least {min_rows()}, so each task writes two batches")
    with tempfile.TemporaryDirectory(prefix="pidctl-demo-") as tmp:
        say("starting Apache Kafka (one KRaft node) ...")
        with KafkaNode() as kafka:
            say(f"  Kafka at {kafka.bootstrap}")
            say(f"starting pidctl, granting producer ids from 2^62 = {SAFE_FIRST_PRODUCER_ID} ...")
            first = ("--first-producer-id", str(SAFE_FIRST_PRODUCER_ID))
            pidctl = ServerProcess(Path(tmp) / "pidctl-data", *first)
            pidctl.start(timeout=START_TIMEOUT_S)
            try:
                say(f"  pidctl at {pidctl.bootstrap}")
                runs = side_by_side(kafka, pidctl, args.rows)
            finally:
                pidctl.terminate()
    say("")
    for line in table(runs, args.rows):
        say(line)
    say("")
    say(
        "Spark's sink writes again what the killed tasks had written; pidctl-kafka's retried "
        "tasks produce with the same producer ids and sequences, so Kafka drops the repeats "
        "(docs/spark-kafka.md)."
    )
    return runs


if __name__ == "__main__":
    main()
