"""A throwaway Spark standalone cluster on loopback: one master and one worker (or more).

Started from the pyspark package's own ``SPARK_HOME`` (``bin/spark-class``), as a user starts
one on a real machine, with its log files in a temporary directory. Every port it opens is a
free one chosen here (the master's RPC, web UI and REST submission ports, the worker's web
UI; the rest are the kernel's choice) and never moves (``spark.port.maxRetries=0``): another
Spark on the machine, on its default ports or not, is never touched. A port taken between its
choice and the daemon's bind (another test's connection took it) makes the daemon start again
on newly chosen ports, up to :data:`PORT_ATTEMPTS` times.
Used by the deployment tests (``tests/ops/spark/test_cluster.py``): jobs reach it with
``bin/spark-submit --master`` :attr:`SparkCluster.master_url`. Needs Java 17.

    with SparkCluster() as cluster:
        subprocess.run([*cluster.submit_command(), "job.py"], check=True)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from ops.testing.coordination import free_port
from ops.testing.serverproc import WAIT_TIMEOUT_S, wait_until

#: How long the master, then the worker, may each take to start and register: a JVM start-up
#: on a busy 2-core machine took up to a minute.
START_TIMEOUT_S = 2 * WAIT_TIMEOUT_S

#: How many times a daemon is started on newly chosen ports when one of its ports was taken.
PORT_ATTEMPTS = 3

#: How long a stopped daemon may take to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 10.0


def spark_home() -> Path:
    """The ``SPARK_HOME`` the installed pyspark package carries (its ``bin/``, ``jars/``)."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


# A port taken meanwhile must stop the daemon, not make it move silently to the next port
# (Spark's default: 16 retries), where the worker and spark-submit would not look.
_NO_PORT_RETRIES = "-Dspark.port.maxRetries=0"

#: What a daemon's log says when a port it was given is taken.
_BIND_FAILED = b"java.net.BindException"


class PortTaken(RuntimeError):
    """A daemon could not bind a port chosen for it: someone took it meanwhile."""


def live_processes(groups: list[int]) -> list[int]:
    """Pids of the processes (zombies aside) whose process group is one of ``groups``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited meanwhile
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'.
        fields = text[text.rindex(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) in groups:
            found.append(int(stat.parent.name))
    return found


class SparkCluster:
    """A standalone master and one worker (``workers`` of them; each ``cores`` cores,
    ``memory``), each daemon in its own process group; ``stop()`` (or leaving the ``with``
    block) kills them all."""

    def __init__(
        self,
        cores: int = 1,
        memory: str = "1g",
        env: dict[str, str] | None = None,
        *,
        worker: bool = True,
        workers: int = 1,
    ) -> None:
        """``env``: more environment for the daemons, which their executors inherit (e.g. a
        ``PATH`` that decides what ``python3`` the executors run); ``worker=False``: the
        master alone."""
        self.home = spark_home()
        self.cores = cores
        self.memory = memory
        self.worker = worker
        self.workers = workers
        self.port = free_port()
        self.webui_port = free_port()
        # Since Spark 4.1 the master serves REST submissions by default, on 6066 unless told.
        self.rest_port = free_port()
        self.worker_webui_port = free_port()
        self.more_worker_webui_ports = [free_port() for _ in range(workers - 1)]
        self.directory = Path(tempfile.mkdtemp(prefix="pidctl-spark-"))
        self.processes: list[subprocess.Popen[bytes]] = []
        # An empty configuration directory: no spark-defaults.conf or spark-env.sh of the
        # machine changes what the tests see.
        conf = self.directory / "conf"
        conf.mkdir()
        self.env = {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_CONF_DIR": str(conf),
            "SPARK_LOCAL_IP": "127.0.0.1",
        }
        daemons = {"SPARK_WORKER_OPTS": _NO_PORT_RETRIES}
        # The daemons' own environment must not hand a Python or a path to the executors.
        for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH"):
            self.env.pop(name, None)
        self.daemon_env = {**self.env, **daemons, **(env or {})}

    def _master_env(self) -> dict[str, str]:
        rest = f"-Dspark.master.rest.port={self.rest_port}"
        return {**self.daemon_env, "SPARK_MASTER_OPTS": f"{_NO_PORT_RETRIES} {rest}"}

    @property
    def master_url(self) -> str:
        """What ``spark-submit --master`` takes."""
        return f"spark://127.0.0.1:{self.port}"

    @property
    def status_url(self) -> str:
        """The master's state as JSON (workers, running and completed applications)."""
        return f"http://127.0.0.1:{self.webui_port}/json"

    def log(self, name: str) -> Path:
        """``master.log`` or ``worker.log`` (stdout and stderr of the daemon)."""
        return self.directory / name

    def status(self) -> dict[str, Any]:
        """The master's JSON status page, parsed."""
        with urllib.request.urlopen(self.status_url, timeout=5) as response:
            return dict(json.load(response))

    def alive_workers(self) -> int:
        """Workers the master counts as ALIVE (0 while the master is not answering)."""
        try:
            workers = self.status().get("workers", [])
        except (OSError, ValueError):  # ValueError: not JSON yet, see _answers
            return 0
        return sum(1 for worker in workers if worker.get("state") == "ALIVE")

    def applications(self, state: str = "completedapps") -> list[dict[str, Any]]:
        """The master's ``activeapps`` or ``completedapps``."""
        return list(self.status().get(state, []))

    def _spawn(
        self, name: str, *arguments: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.log(f"{name}.log"), "wb") as log:
            proc = subprocess.Popen(
                [str(self.home / "bin" / "spark-class"), *arguments],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env or self.daemon_env,
                cwd=self.directory,
                start_new_session=True,  # its own process group: the JVM and the script
            )
        self.processes.append(proc)
        return proc

    def _why(self, name: str) -> str:
        """The daemon's first exception line (the cause, in one line), then where its log is."""
        try:
            lines = self.log(f"{name}.log").read_text(errors="replace").splitlines()
        except OSError:
            lines = []
        cause = next((line.strip() for line in lines if "Exception:" in line), "no exception")
        return f"{cause} (log: {self.log(f'{name}.log')})"

    def _wait(self, proc: subprocess.Popen[bytes], name: str, condition: Any, what: str) -> None:
        def ready() -> bool:
            # A daemon that failed to bind can stay up without serving (seen in CI: the
            # master waited out its whole start time): read its log for the cause.
            if _BIND_FAILED in self.log(f"{name}.log").read_bytes():
                raise PortTaken(f"spark {name}: {self._why(name)}")
            if proc.poll() is not None:
                raise RuntimeError(f"spark {name} exited with {proc.returncode}: {self._why(name)}")
            return bool(condition())

        try:
            wait_until(ready, what, timeout=START_TIMEOUT_S, poll=0.2)
        except TimeoutError as e:
            raise TimeoutError(f"{e}: {self._why(name)}") from None

    def start(self) -> SparkCluster:
        """Start the master, then the workers; return once every worker is registered."""
        try:
            for attempt in range(PORT_ATTEMPTS):
                master = self._spawn(
                    "master",
                    "org.apache.spark.deploy.master.Master",
                    *("--host", "127.0.0.1", "--port", str(self.port)),
                    *("--webui-port", str(self.webui_port)),
                    env=self._master_env(),
                )
                try:
                    self._wait(master, "master", self._answers, "spark master answering and ALIVE")
                    break
                except PortTaken:
                    self._kill(master)
                    if attempt == PORT_ATTEMPTS - 1:
                        raise
                    self.port, self.webui_port, self.rest_port = (free_port() for _ in range(3))
            if not self.worker:
                return self
            webui_ports = [self.worker_webui_port, *self.more_worker_webui_ports]
            for index, webui_port in enumerate(webui_ports):
                name = "worker" if index == 0 else f"worker-{index + 1}"
                work_dir = self.directory / ("work" if index == 0 else f"work-{index + 1}")
                work_dir.mkdir()
                self._start_worker(
                    name,
                    "127.0.0.1",
                    webui_port,
                    work_dir,
                    lambda count=index + 1: self.alive_workers() == count,
                )
        except BaseException:
            self.stop(keep_logs=True)
            raise
        return self

    def add_worker(self, host: str) -> subprocess.Popen[bytes]:
        """Start one more worker (``cores``, ``memory``) advertising ``host`` (another
        loopback address, 127.0.0.2, makes it a host of its own, as speculation needs), with
        its own web UI port and work dir; return once the master counts it ALIVE. Its
        process group (``.pid``) holds it and the executors it starts."""
        alive = self.alive_workers()
        name = f"added-worker-{len(self.processes)}"
        work_dir = self.directory / name
        work_dir.mkdir()
        return self._start_worker(
            name, host, free_port(), work_dir, lambda: self.alive_workers() > alive
        )

    def _start_worker(
        self, name: str, host: str, webui_port: int, work_dir: Path, registered: Any
    ) -> subprocess.Popen[bytes]:
        """A worker on ``host``, started again on a new web UI port if its own was taken."""
        for attempt in range(PORT_ATTEMPTS):
            worker = self._spawn(
                name,
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                *("--host", host, "--cores", str(self.cores), "--memory", self.memory),
                *("--webui-port", str(webui_port), "--work-dir", str(work_dir)),
                env={**self.daemon_env, "SPARK_LOCAL_IP": host},
            )
            try:
                self._wait(worker, name, registered, f"spark {name} registered")
                return worker
            except PortTaken:
                self._kill(worker)
                if attempt == PORT_ATTEMPTS - 1:
                    raise
                webui_port = free_port()
        raise AssertionError("unreachable")

    def _answers(self) -> bool:
        """The master answers, as the one leader (ALIVE, not STANDBY)."""
        try:
            return self.status().get("status") == "ALIVE"
        except (OSError, ValueError):
            # While its web UI starts, the master can answer /json with its HTML front page
            # (seen once in CI): not answering yet.
            return False

    def submit_command(self) -> list[str]:
        """``bin/spark-submit --master spark://...`` of the same SPARK_HOME, without the
        driver's web UI (it would take 4040 or the next port free); append options, the
        job's script and its arguments."""
        return [
            str(self.home / "bin" / "spark-submit"),
            "--master",
            self.master_url,
            "--conf",
            "spark.ui.enabled=false",
        ]

    def submit_env(self, **extra: str) -> dict[str, str]:
        """The environment for ``spark-submit``: this SPARK_HOME, loopback, plus ``extra``."""
        return {**self.env, **extra}

    def process_groups(self) -> list[int]:
        """The process groups of the daemons started (a group's id is its leader's pid)."""
        return [proc.pid for proc in self.processes]

    def stop(self, keep_logs: bool = False) -> None:
        """SIGTERM each daemon's process group, SIGKILL what is left after
        :data:`STOP_TIMEOUT_S`, and wait (bounded) until no process of the groups is left;
        remove the directory unless ``keep_logs``."""
        groups = self.process_groups()
        for proc in reversed(self.processes):  # the worker first
            self._kill(proc)
        self.processes.clear()
        wait_until(
            lambda: not live_processes(groups), "spark processes gone", timeout=STOP_TIMEOUT_S
        )
        if not keep_logs:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM the daemon's process group, SIGKILL it after :data:`STOP_TIMEOUT_S`."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(STOP_TIMEOUT_S)
        # Executors a worker started live in its group too; make sure none outlives it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
