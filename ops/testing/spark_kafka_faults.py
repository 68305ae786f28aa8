"""Faults during a Spark-to-Kafka job on a real standalone cluster, for ``pidctl-kafka`` (its
data source, and ``write_kafka`` with the JVM carrier) and for Spark's own Kafka sink side by
side: the same job (``ops/spark/examples/kafka_write.py``),
the same broker, the same cluster (a master and two workers on two loopback hosts, 127.0.0.1
and 127.0.0.2, so that speculation has another host to copy a task to). Each run writes a
fresh topic and counts its rows by their unique id with a real consumer.

Faults (joined with ``+`` to combine, e.g. ``executor+speculation``): ``none``; ``executor``
(SIGKILL the executors on the host of a task that is mid-write); ``executors`` (SIGKILL every
executor JVM then: every task running is mid-write, so its retry starts over, whatever the
timing; ``ops/dev.sh demo``);
``worker`` (SIGKILL the second worker with its executor; a new one replaces it afterwards);
``speculation`` (``spark.speculation`` on, one partition's first attempt 5x slower, so a copy
runs beside it); ``driver`` (SIGKILL ``spark-submit`` mid-write, then run the job again, as a
scheduler would: pidctl-kafka with the same ``txnAppId``/``txnVersion``); ``broker`` (SIGKILL
the broker mid-write, start it again :data:`BROKER_DOWN_S` later on its data and ports).
A pidctl-kafka run is also checked by ``pidctl kafka verify`` (``kafka_verify.py``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.testing.jars import classpath
from ops.testing.kafka import KafkaNode
from ops.testing.kafka_topics import count, new_topic, written_rows
from ops.testing.serverproc import ServerProcess, wait_until
from ops.testing.spark_cluster import SparkCluster, live_processes
from pidctl.spark import carrier
from pidctl.spark.kafka_verify import verify

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "ops" / "spark" / "examples" / "kafka_write.py"
FAULTS = ("none", "executor", "worker", "speculation", "driver", "broker")
SINKS = ("pidctl-kafka", "write_kafka", "kafka")
#: How long one submission may take on a busy 2-core machine.
SUBMIT_TIMEOUT_S = 600
SECOND_HOST = "127.0.0.2"
#: How long the broker stays down in the ``broker`` fault.
BROKER_DOWN_S = 5.0
#: Rows per Arrow batch of the faults' jobs: ``--slow-ms`` sleeps per batch, so that a
#: partition's rows arrive over a few seconds and a fault lands mid-write.
BATCH_ROWS = 500
#: ``spark.buffer.size`` of the faults' jobs: less than one batch, so each batch leaves the
#: Python worker as it is made.
PYTHON_BUFFER_BYTES = 1024
#: Partitions of a faulted job's topic (one task each), unless told otherwise.
PARTITIONS = 4


def min_rows(partitions: int = PARTITIONS) -> int:
    """The fewest rows a faulted job may write: a task of two batches each, so that a fault
    can land between them."""
    return 2 * BATCH_ROWS * partitions


@dataclass(frozen=True)
class FaultRun:
    """One job under one fault: the rows a consumer counts by id, and the runs' exit codes."""

    fault: str
    sink: str
    rows: int
    duplicates: int
    missing: int
    exit_codes: tuple[int, ...]
    seconds: float
    #: Task attempts beyond each partition's first (retries and speculative copies; of the
    #: last run for ``driver``).
    extra_attempts: int
    #: ``pidctl kafka verify``'s verdict on the version (pidctl-kafka only; else None).
    verified: bool | None = None
    topic: str = ""
    app_id: str = ""
    #: Executor JVMs SIGKILLed (``executor``, ``executors``).
    executors_killed: int = 0


def executor_pids(groups: list[int], host: str | None = None) -> list[int]:
    """Executor JVMs (CoarseGrainedExecutorBackend) in the given process groups (those
    on ``host`` only, if given)."""
    found = []
    for pid in live_processes(groups):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" not in command:
            continue
        if host is None or command[command.index(b"--hostname") + 1].decode() == host:
            found.append(pid)
    return found


def _progress(attempt: Path) -> tuple[int, str]:
    """The batches an attempt's sink has taken and its executor's host (0 and "" while its
    file is being written)."""
    try:
        taken, _, host = attempt.read_text().partition(" ")
        return int(taken or 0), host
    except (OSError, ValueError):
        return 0, ""


class KafkaFaults:
    """Runs the job under faults on one cluster (which it extends with a second worker)."""

    def __init__(
        self,
        cluster: SparkCluster,
        kafka: KafkaNode,
        pidctl: ServerProcess,
        *,
        rows: int = 20_000,
        partitions: int = PARTITIONS,
        slow_ms: int = 300,
    ) -> None:
        if rows < min_rows(partitions):
            raise ValueError(
                f"{rows} rows in {partitions} partitions make no task of two batches: "
                f"{min_rows(partitions)} at least"
            )
        self.cluster, self.kafka, self.pidctl = cluster, kafka, pidctl
        self.rows, self.partitions, self.slow_ms = rows, partitions, slow_ms
        jars = classpath("spark-kafka").split(os.pathsep)
        clients = next(jar for jar in jars if "kafka-clients" in jar)
        # write_kafka's JVM carrier beside Spark's own connector.
        self.jars = ",".join([*jars, str(carrier.build(Path(clients)))])
        self.second_worker = cluster.add_worker(SECOND_HOST)
        #: The last submission's stdout and stderr, beside the cluster's own logs.
        self.output = cluster.directory / "submit.log"

    def _command(
        self, sink: str, topic: str, app_id: str, speculation: bool, attempts: Path
    ) -> list[str]:
        conf = {
            "spark.executor.memory": "512m",
            "spark.log.level": "WARN",
            "spark.pyspark.python": sys.executable,
            "spark.task.maxFailures": "8",
            # The Python worker's output buffer (64 KiB by default) would hold a task's small
            # batches (4 KB each) until the task ends, and a fault mid-task would land before
            # any of its rows reached the sink: flushed a batch at a time, they reach it as
            # a larger job's do.
            "spark.buffer.size": str(PYTHON_BUFFER_BYTES),
        }
        if speculation:
            conf |= {
                "spark.speculation": "true",
                "spark.speculation.interval": "200ms",
                "spark.speculation.quantile": "0.5",
                "spark.speculation.multiplier": "1.5",
            }
        command = [*self.cluster.submit_command(), "--jars", self.jars]
        for name, value in conf.items():
            command += ["--conf", f"{name}={value}"]
        command += [str(JOB), "--format", sink, "--kafka", self.kafka.bootstrap, "--topic", topic]
        command += ["--rows", str(self.rows), "--partitions", str(self.partitions)]
        command += ["--slow-ms", str(self.slow_ms), "--batch-rows", str(BATCH_ROWS)]
        command += ["--pidctl", self.pidctl.bootstrap]
        command += ["--app-id", app_id, "--version", "1", "--attempts-dir", str(attempts)]
        if speculation:
            command += ["--straggler", "0"]
        return command

    def _start(self, command: list[str]) -> subprocess.Popen[str]:
        """``spark-submit`` in its own process group, its output in :attr:`output` (a file: a
        pipe nobody reads while the job runs would fill and stop the driver)."""
        env = self.cluster.submit_env(PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(ROOT))
        with open(self.output, "w") as output:
            return subprocess.Popen(
                command,
                env=env,
                cwd=ROOT,
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,  # its own group: the driver JVM and its Python
            )

    def _said(self) -> str:
        """The end of the last submission's output (why it failed)."""
        return self.output.read_text(errors="replace")[-3000:]

    def _finish(self, proc: subprocess.Popen[str]) -> int:
        proc.wait(timeout=SUBMIT_TIMEOUT_S)
        if proc.returncode:
            sys.stderr.write(self._said())
        return proc.returncode

    def _mid_write(
        self, topic: str, proc: subprocess.Popen[str], attempts: Path, host: str | None = None
    ) -> str:
        """Wait until a tenth of the rows are in Kafka and a task (on ``host``, if given) is
        mid-write: its sink has taken a fifth of its batches (at least one) and has as many
        more to take (the attempt files say so; a count of the topic alone can come back
        after every running task has finished, on a busy machine, and a fault then lands
        between tasks). The host of that task's executor."""
        batches = -(-self.rows // self.partitions // BATCH_ROWS)
        margin = max(1, batches // 5)
        found: list[str] = []

        def running() -> None:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"the job ended before the fault ({proc.returncode}):\n{self._said()}"
                )

        def a_tenth_written() -> bool:
            running()
            return written_rows(self.kafka.bootstrap, topic) >= self.rows // 10

        def mid_write() -> bool:
            running()
            progress = [_progress(path) for path in attempts.iterdir()]
            found[:] = [
                on
                for taken, on in progress
                if margin <= taken <= batches - margin and host in (None, on)
            ]
            return bool(found)

        wait_until(a_tenth_written, "a tenth of the rows written", SUBMIT_TIMEOUT_S, 0.2)
        wait_until(mid_write, f"a task mid-write on {host or 'any host'}", SUBMIT_TIMEOUT_S, 0.02)
        return found[0]

    def run(self, fault: str, sink: str) -> FaultRun:
        """The job under ``fault`` with ``sink``; the counts of its topic."""
        topic = new_topic(self.kafka.bootstrap, self.partitions, prefix=f"{fault}-{sink}")
        app_id = f"faults-{uuid.uuid4().hex[:8]}"
        attempts = Path(tempfile.mkdtemp(prefix="pidctl-attempts-"))
        speculation = "speculation" in fault.split("+")
        command = self._command(sink, topic, app_id, speculation, attempts)
        started = time.monotonic()
        proc = self._start(command)
        codes = []
        killed: list[int] = []
        kills = set(fault.split("+")) - {"speculation", "none"}
        if kills & {"executor", "executors"}:
            host = self._mid_write(topic, proc, attempts)
            every = kills == {"executors"}
            killed = executor_pids(self.cluster.process_groups(), None if every else host)
            if not killed:  # a fault that did not happen must not read as no duplicates
                raise RuntimeError(f"no executor JVM to kill mid-write:\n{self._said()}")
            for victim in killed:
                os.kill(victim, signal.SIGKILL)
        elif kills == {"worker"}:
            self._mid_write(topic, proc, attempts, SECOND_HOST)
            os.killpg(self.second_worker.pid, signal.SIGKILL)
            self.second_worker.wait(30)
        elif kills == {"broker"}:
            self._mid_write(topic, proc, attempts)
            self.kafka.kill()
            time.sleep(BROKER_DOWN_S)
            self.kafka.restart()
        elif kills == {"driver"}:
            self._mid_write(topic, proc, attempts)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            codes.append(proc.returncode)
            wait_until(
                lambda: not self.cluster.applications("activeapps"),
                "the killed driver's application ended",
                timeout=SUBMIT_TIMEOUT_S,
            )
            shutil.rmtree(attempts)
            attempts.mkdir()
            proc = self._start(command)  # the re-run
        codes.append(self._finish(proc))
        seconds = time.monotonic() - started
        if kills == {"worker"}:
            self.second_worker = self.cluster.add_worker(SECOND_HOST)
        extra = sum(1 for path in attempts.iterdir() if not path.name.endswith("-0"))
        shutil.rmtree(attempts)
        counted = count(self.kafka.bootstrap, topic, self.rows)
        verified = None
        if sink != "kafka":
            verdict = verify([self.kafka.bootstrap], topic, app_id, 1, expected_rows=self.rows)
            verified = verdict.ok
        return FaultRun(
            fault,
            sink,
            counted.rows,
            counted.duplicates,
            counted.missing,
            tuple(codes),
            seconds,
            extra,
            verified,
            topic,
            app_id,
            len(killed),
        )


def report(runs: list[FaultRun]) -> list[dict[str, Any]]:
    """The runs as JSON-friendly rows."""
    return [run.__dict__ for run in runs]
