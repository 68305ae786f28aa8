"""pidctl-kafka on a real standalone master with two workers (two loopback hosts), a real
Kafka and a real pidctl, under the faults of ops/testing/spark_kafka_faults.py: an executor
JVM killed mid-write with speculation on, and the driver killed and the job run again.
Every case: every row exactly once, counted by id with a consumer. One cluster serves every
case; a worker's kill, and Spark's own sink under every fault, are measured by ``python -m
ops.bench.spark_kafka --faults`` (its duplicates beside ours), not here, to keep CI short."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.testing.kafka import KafkaNode
from ops.testing.serverproc import ServerProcess
from ops.testing.spark_cluster import SparkCluster, live_processes
from ops.testing.spark_kafka_faults import KafkaFaults

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaFaults]:
    """One cluster, broker and controller (PIDs from 2^62, as the docs advise) for every case;
    executors run this interpreter, where pidctl is installed."""
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


#: Speculation shares a run with the executor kill: one submission fewer in CI. A worker's
#: kill is, for pidctl-kafka, its executor's kill with the retries on the other host: it
#: runs in the benchmark's fault cases (``ops.bench.spark_kafka --faults``), not in CI.
@pytest.mark.parametrize("fault", ["executor+speculation", "driver"])
def test_every_row_once_under(faults: KafkaFaults, fault: str) -> None:
    run = faults.run(fault, "pidctl-kafka")
    print(run)
    assert run.exit_codes[-1] == 0
    assert (run.rows, run.duplicates, run.missing) == (faults.rows, 0, 0)
    if fault != "driver":  # the fault made Spark run more attempts than partitions
        assert run.extra_attempts > 0
