"""Benchmark: ``format("pidctl-kafka")`` against Spark's own Kafka sink, same job, same cluster,
same broker, measured in the same run.

    python -m ops.bench.spark_kafka [--rows 1000000] [--partitions 8] [--topic-partitions 6]
        [--rounds 5] [--wide-partitions 1000] [--faults]

- Throughput on a standalone cluster (a master and two workers of one core and 1 GiB, as a
  data team runs it): the job ``ops/spark/examples/kafka_write.py`` (``--rows`` rows in
  ``--partitions`` Spark partitions into a fresh topic of ``--topic-partitions`` partitions,
  a string key and a ~107-byte value) submitted with ``spark-submit``, by Spark's
  ``format("kafka")`` (spark-sql-kafka-0-10 4.2.0 from Maven Central), by
  ``format("pidctl-kafka")`` (Python tasks) and by ``write_kafka`` (the JVM carrier,
  ``ops/spark/carrier.py``) in turn, ``--rounds`` rounds, each sink first in every third
  round. Per run: the submission's seconds (start to exit, what a scheduler waits for), the
  write's own seconds (``save()``, printed by the job), and the CPU seconds of the cluster
  (workers, executors and their Python workers), of the driver (``spark-submit``, its
  Python and Python workers), of the broker and of pidctl; every run's rows counted by id
  with a consumer. Per round the ratios Spark's seconds / each of ours (above 1: ours is
  faster); the results are their medians.
- The broker's producer-state count after a job of ``--wide-partitions`` Spark partitions
  (DescribeProducers over every partition of the topic), for both sinks, in a local
  session: pidctl-kafka holds one PID per Spark partition and Kafka partition written,
  Spark's sink one per executor.
- With ``--faults``: each sink (``SINKS``) under each fault of
  ops/testing/spark_kafka_faults.py on a standalone master with two workers (executor
  killed, worker killed, speculation, driver killed and re-run, broker killed and
  restarted): rows, duplicates and missing, counted by id with a consumer.

Prints one JSON object. Needs the ``spark`` extra and Java 17; the jars come from
``python -m ops.testing.jars``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ops.bench.common import ROOT, median_by
from ops.testing.jars import classpath
from ops.testing.kafka import KafkaNode
from ops.testing.kafka_topics import count, new_topic
from ops.testing.serverproc import WITHOUT_HYPOTHESIS, ServerProcess
from ops.testing.spark_cluster import SparkCluster
from ops.testing.spark_kafka_faults import FAULTS, SINKS, KafkaFaults, report
from pidctl.spark import carrier
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
        writer = writer.option("txnAppId", f"bench-{topic}").option("txnVersion", "1")
    writer.save()


def group_cpu_seconds(groups: list[int]) -> float:
    """CPU seconds of every live process of the process ``groups`` (with what each has
    reaped: a worker's counts its executors once they exit)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in groups:  # pgrp
            total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    """CPU seconds of this process's children it has waited for (a ``spark-submit`` run)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


#: The sinks, each first in every third round: Spark's own, pidctl-kafka's data source and
#: write_kafka (the JVM carrier).
CLUSTER_SINKS = ("kafka", "pidctl-kafka", "write_kafka")
OURS = ("pidctl-kafka", "write_kafka")


class ClusterRuns:
    """Submissions of the benchmark job to one standalone cluster, broker and pidctl."""

    def __init__(
        self, cluster: SparkCluster, kafka: KafkaNode, pidctl: ServerProcess, args: Any
    ) -> None:
        self.cluster, self.kafka, self.pidctl, self.args = cluster, kafka, pidctl, args
        jars = classpath("spark-kafka").split(os.pathsep)
        clients = next(jar for jar in jars if "kafka-clients" in jar)
        self.jars = ",".join([*jars, str(carrier.build(Path(clients)))])
        #: Spark's Python workers as an installed pidctl's: no hypothesis (kio imports it).
        self.python_path = str(WITHOUT_HYPOTHESIS)

    def command(self, sink: str, topic: str, rows: int, partitions: int) -> list[str]:
        conf = {
            "spark.executor.memory": "512m",
            "spark.log.level": "WARN",
            "spark.pyspark.python": sys.executable,
            "spark.executorEnv.PYTHONPATH": self.python_path,
        }
        command = [*self.cluster.submit_command(), "--jars", self.jars]
        for name, value in conf.items():
            command += ["--conf", f"{name}={value}"]
        command += [str(ROOT / "ops" / "spark" / "examples" / "kafka_write.py")]
        command += ["--format", sink, "--kafka", self.kafka.bootstrap, "--topic", topic]
        command += ["--rows", str(rows), "--partitions", str(partitions)]
        command += ["--pidctl", self.pidctl.bootstrap]
        command += ["--app-id", f"bench-{uuid.uuid4().hex[:8]}", "--version", "1"]
        return command

    def _pidctl_pid(self) -> int:
        assert self.pidctl.proc is not None, "pidctl is not running"
        return self.pidctl.proc.pid

    def run(self, sink: str, rows: int, partitions: int, *, counted: bool = True) -> dict[str, Any]:
        """One submission of the job with ``sink``: its times, CPU and (if ``counted``) the
        rows read back by id."""
        topic = new_topic(self.kafka.bootstrap, self.args.topic_partitions, prefix=sink)
        groups = self.cluster.process_groups()
        env = self.cluster.submit_env(
            PYSPARK_PYTHON=sys.executable, PYTHONPATH=f"{self.python_path}{os.pathsep}{ROOT}"
        )
        before = (
            group_cpu_seconds(groups),
            children_cpu_seconds(),
            process_cpu_seconds(self.kafka.pid),
            process_cpu_seconds(self._pidctl_pid()),
        )
        started = time.perf_counter()
        done = subprocess.run(
            self.command(sink, topic, rows, partitions),
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            start_new_session=True,
        )
        seconds = time.perf_counter() - started
        after = (
            group_cpu_seconds(groups),
            children_cpu_seconds(),
            process_cpu_seconds(self.kafka.pid),
            process_cpu_seconds(self._pidctl_pid()),
        )
        if done.returncode:
            raise RuntimeError(f"{sink} job failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        reported = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        names = ("cluster", "driver", "broker", "pidctl")
        cpu = {name: b - a for name, a, b in zip(names, before, after, strict=True)}
        run: dict[str, Any] = {
            "sink": sink,
            "topic": topic,
            "job_s": round(seconds, 2),
            "write_s": reported[-1]["write_s"],
            "cpu_s": {name: round(value, 2) for name, value in cpu.items()},
        }
        if counted:
            found = count(self.kafka.bootstrap, topic, rows)
            run["duplicates"], run["missing"] = found.duplicates, found.missing
        return run


def _ratio_of(sink: str) -> Callable[[dict[str, Any]], float]:
    """A round's job ratio of ``sink`` (what the median round is chosen by)."""
    return lambda round_: float(round_[f"{sink}_job_ratio"])


def cluster_rounds(
    kafka: KafkaNode, pidctl: ServerProcess, args: argparse.Namespace
) -> dict[str, Any]:
    """The sinks on the same job in turn, ``--rounds`` rounds on one standalone cluster (a
    master and two workers of one core and 1 GiB), each sink first in one round of every
    three: per round each run's times and CPU, and the ratios Spark's seconds / each of
    pidctl-kafka's; the median of each over the rounds."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    rounds = []
    with SparkCluster(workers=2, env={"PATH": path}) as cluster:
        runs = ClusterRuns(cluster, kafka, pidctl, args)
        for sink in CLUSTER_SINKS:  # a first small job of each: jars and caches warm
            runs.run(sink, 1000, 2, counted=False)
        for index in range(args.rounds):
            turn = index % len(CLUSTER_SINKS)
            order = CLUSTER_SINKS[turn:] + CLUSTER_SINKS[:turn]
            by_sink = {sink: runs.run(sink, args.rows, args.partitions) for sink in order}
            spark = by_sink["kafka"]
            one: dict[str, Any] = {"round": index, "first": order[0], "kafka": spark}
            for sink in OURS:
                mine = by_sink[sink]
                one[sink] = mine
                one[f"{sink}_job_ratio"] = round(spark["job_s"] / mine["job_s"], 3)
                one[f"{sink}_write_ratio"] = round(spark["write_s"] / mine["write_s"], 3)
            rounds.append(one)
            partial(f"round {index}", one)
    medians: dict[str, Any] = {}
    for sink in OURS:
        for measure in ("job", "write"):
            key = f"{sink}_{measure}_ratio"
            medians[f"median_{key}"] = statistics.median(r[key] for r in rounds)
        medians[f"{sink}_median_round"] = median_by(rounds, _ratio_of(sink))
    return {
        "rows": args.rows,
        "partitions": args.partitions,
        "topic_partitions": args.topic_partitions,
        "workers": 2,
        **medians,
        "rounds": rounds,
        "load_average": [round(load, 2) for load in os.getloadavg()],
    }


def producer_states(kafka: KafkaNode, topic: str, partitions: int) -> int:
    cluster = KafkaCluster([kafka.bootstrap], client_id="bench", timeout_s=60, connection={})
    try:
        found = cluster.describe_producers((topic, p) for p in range(partitions))
    finally:
        cluster.close()
    return sum(len(states) for states in found.values())


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
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the cluster job")
    parser.add_argument("--partitions", type=int, default=8, help="its Spark partitions")
    parser.add_argument("--topic-partitions", type=int, default=6, help="its Kafka partitions")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both sinks")
    parser.add_argument(
        "--wide-partitions",
        type=int,
        default=1000,
        help="Spark partitions of the broker-state job (0: skip it)",
    )
    parser.add_argument(
        "--wide-topic-partitions", type=int, default=4, help="Kafka partitions of that job"
    )
    parser.add_argument("--faults", action="store_true", help="also the fault comparison")
    parser.add_argument(
        "--fault-list", default=",".join(FAULTS), help="faults to run, comma-separated"
    )
    parser.add_argument(
        "--fault-sinks", default=",".join(SINKS), help="sinks under faults, comma-separated"
    )
    parser.add_argument("--skip-throughput", action="store_true", help="skip the throughput rounds")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"value_bytes": VALUE_BYTES}
    with (
        tempfile.TemporaryDirectory(prefix="pidctl-bench-kafka-") as tmp,
        KafkaNode(shipped_jvm=True) as kafka,
        started(
            ServerProcess(Path(tmp) / "data", "--first-producer-id", str(JOB_RANGE_START))
        ) as pidctl,
    ):
        if not args.skip_throughput:
            result["cluster"] = cluster_rounds(kafka, pidctl, args)
        if args.wide_partitions:
            spark = session(classpath("spark-kafka").replace(os.pathsep, ","))
            try:
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
