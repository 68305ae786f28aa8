"""pidctl-kafka on a real standalone master with two workers (two loopback hosts), a real
Kafka and a real pidctl, under ops/testing/spark_kafka_faults.py's faults: an executor JVM
killed mid-write, with speculation on. Every row exactly once, counted by id with a consumer
and confirmed by ``pidctl kafka verify``, which then finds a duplicate planted afterwards;
the driver's log says what the job wrote.

The one cluster case CI runs (a submission takes minutes on a busy 2-core machine). The
worker's kill, the driver's kill and re-run, a broker killed and restarted mid-job, and
Spark's own sink under each, run in the benchmark's fault cases (``python -m
ops.bench.spark_kafka --faults``, docs/spark-kafka.md); the re-run's checks and the broker's
restart are also tested without a cluster (test_kafka_sink.py, test_kafka_producer.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ops.testing.kafka import KafkaNode
from ops.testing.serverproc import ServerProcess
from ops.testing.spark_cluster import SparkCluster, live_processes
from ops.testing.spark_kafka_faults import KafkaFaults
from pidctl.spark.kafka_verify import verify

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaFaults]:
    """One cluster, broker and controller (PIDs from 2^62, as the docs advise); executors
    run this interpreter, where pidctl is installed."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    data = tmp_path_factory.mktemp("pidctl") / "data"
    with (
        KafkaNode() as kafka,
        ServerProcess(data, "--first-producer-id", str(2**62)) as pidctl,
        SparkCluster(env={"PATH": path}) as cluster,
    ):
        groups = cluster.process_groups
        yield KafkaFaults(cluster, kafka, pidctl)
        everything = groups()
    assert live_processes(everything) == []


def test_every_row_once_when_an_executor_dies_and_the_verifier_says_so(
    faults: KafkaFaults,
) -> None:
    run = faults.run("executor+speculation", "pidctl-kafka")
    print(run)
    assert run.exit_codes[-1] == 0
    assert (run.rows, run.duplicates, run.missing) == (faults.rows, 0, 0)
    assert run.extra_attempts > 0  # the fault made Spark run more attempts than partitions
    assert run.verified is True
    said = faults.output.read_text(errors="replace")
    assert f"txnAppId '{run.app_id}' version 1: {faults.rows} rows:" in said
    # A planted duplicate: one of the job's rows produced again by another producer.
    copy = Producer({"bootstrap.servers": faults.kafka.bootstrap})
    copy.produce(run.topic, key=b"123", value=b"123:" + b"x" * 100, partition=0)
    copy.flush(30)
    verdict = verify([faults.kafka.bootstrap], run.topic, run.app_id, 1, expected_rows=faults.rows)
    assert (verdict.ok, verdict.duplicate_rows) == (False, 1)
