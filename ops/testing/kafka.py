"""A throwaway Apache Kafka on loopback: one KRaft node that is broker and controller.

The reference the tests and benchmarks compare pidctl with. It runs Kafka's own classes
(``kafka.Kafka``) from the jars ``python -m ops.testing.jars`` fetched, formatted with Kafka's
``StorageTool`` as ``kafka-storage.sh format`` would, on free loopback ports: a PLAINTEXT
listener for clients (:attr:`KafkaNode.bootstrap`) and a separate CONTROLLER listener
(:attr:`KafkaNode.controller_bootstrap`) on which Kafka's own controller answers
BrokerRegistration, BrokerHeartbeat and AllocateProducerIds. Its data, configuration and
log live in one temporary directory that :meth:`KafkaNode.stop` removes.

With ``sasl_users`` it also has SASL_PLAINTEXT (PLAIN) listeners for those users, one for
clients (:attr:`KafkaNode.sasl_bootstrap`) and one on the controller
(:attr:`KafkaNode.controller_sasl_bootstrap`), and Kafka's ACL authorizer: the PLAINTEXT
listeners (``User:ANONYMOUS``, also the node's own connections) are super users, the SASL
users may do only what ACLs allow (none are created), so a test can see Kafka's
authorisation errors.

    with KafkaNode() as kafka:
        producer = Producer({"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True})
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from ops.testing.coordination import free_port
from ops.testing.jars import classpath
from ops.testing.java import require_java
from ops.testing.serverproc import WAIT_TIMEOUT_S
from pidctl.client import SyncClient
from pidctl.protocol import requests

#: How long Kafka may take to start and answer as a broker: a JVM start on a busy 2-core
#: machine took up to a minute.
START_TIMEOUT_S = 2 * WAIT_TIMEOUT_S
#: How long a stopped Kafka may take to exit after SIGTERM before it is killed.
STOP_TIMEOUT_S = 30.0
#: Lines of Kafka's log shown when it fails.
LOG_TAIL_LINES = 40
#: The broker's and controller's node id (a single combined node).
NODE_ID = 1
#: The JVM's options: a heap that fits beside the tests, no hsperfdata files left in /tmp.
JVM_OPTIONS = ("-Xms256m", "-Xmx768m", "-XX:-UsePerfData", "-Djava.awt.headless=true")
#: What the test suite gives its short-lived JVMs through JAVA_TOOL_OPTIONS (tests/conftest.py:
#: C1 only, one GC thread); a benchmark's Kafka runs without them, as shipped.
QUICK_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

#: Settings every node gets: what a single node needs (replication factor 1 for Kafka's
#: internal topics), everything else as Kafka ships it. ``settings`` add or override.
BASE_SETTINGS: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": str(NODE_ID),
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
}

#: Kafka's ACL authorizer in KRaft mode.
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
"""


class KafkaStartError(RuntimeError):
    """Kafka did not start: the message carries the reason and the tail of its log."""


class KafkaNode:
    """One Apache Kafka node (broker and KRaft controller) in its own process group."""

    def __init__(
        self,
        settings: Mapping[str, str] | None = None,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        sasl_users: Mapping[str, str] | None = None,
        shipped_jvm: bool = False,
    ) -> None:
        """``settings``: Kafka properties added to :data:`BASE_SETTINGS` (e.g.
        ``{"transaction.max.timeout.ms": "60000"}``). ``port``/``controller_port``: the
        listeners' ports (free ones by default). ``sasl_users``: user → password of the
        SASL listeners and the authorizer (none by default). ``shipped_jvm``: the broker's
        JVM without :data:`QUICK_JVM_OPTIONS` (for benchmarks)."""
        self.shipped_jvm = shipped_jvm
        self.settings = {**BASE_SETTINGS, **(settings or {})}
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.sasl_users = dict(sasl_users or {})
        self.sasl_port = free_port() if self.sasl_users else 0
        self.controller_sasl_port = free_port() if self.sasl_users else 0
        self.directory = Path(tempfile.mkdtemp(prefix="pidctl-kafka-"))
        self.cluster_id = ""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """``HOST:PORT`` of the PLAINTEXT listener, for clients."""
        return f"127.0.0.1:{self.port}"

    @property
    def controller_bootstrap(self) -> str:
        """``HOST:PORT`` of the CONTROLLER listener, where Kafka's KRaft controller answers."""
        return f"127.0.0.1:{self.controller_port}"

    @property
    def sasl_bootstrap(self) -> str:
        """``HOST:PORT`` of the SASL_PLAINTEXT client listener (with ``sasl_users``)."""
        assert self.sasl_port, "started without sasl_users"
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def controller_sasl_bootstrap(self) -> str:
        """``HOST:PORT`` of the controller's SASL_PLAINTEXT listener (with ``sasl_users``)."""
        assert self.controller_sasl_port, "started without sasl_users"
        return f"127.0.0.1:{self.controller_sasl_port}"

    @property
    def log_file(self) -> Path:
        """Kafka's own log (log4j 2, INFO)."""
        return self.directory / "server.log"

    @property
    def pid(self) -> int:
        """The JVM's process id (for CPU and memory figures)."""
        assert self.process is not None, "not started"
        return self.process.pid

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """Kafka's ERROR and FATAL lines (the reason it stopped is often far from the end),
        then the last ``lines`` of its log and of its console output."""
        parts = []
        for path in (self.log_file, self.directory / "console.log"):
            with contextlib.suppress(FileNotFoundError):
                text = path.read_text(errors="replace").splitlines()
                errors = [line for line in text if " ERROR " in line or " FATAL " in line]
                if errors:
                    parts.append(f"--- errors in {path.name}\n" + "\n".join(errors[-10:]))
                parts.append(f"--- {path.name}\n" + "\n".join(text[-lines:]))
        return "\n".join(parts) or "(Kafka wrote no log)"

    def _sasl_properties(self) -> dict[str, str]:
        """The SASL listeners (PLAIN, for ``sasl_users``) and the ACL authorizer."""
        users = " ".join(f'user_{user}="{password}"' for user, password in self.sasl_users.items())
        jaas = f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
        properties = {
            "controller.listener.names": "CONTROLLER,CONTROLLER_SASL",
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,"
                "SASL:SASL_PLAINTEXT,CONTROLLER_SASL:SASL_PLAINTEXT"
            ),
            "authorizer.class.name": AUTHORIZER,
            "super.users": "User:ANONYMOUS",
        }
        for listener in ("sasl", "controller_sasl"):
            properties[f"listener.name.{listener}.sasl.enabled.mechanisms"] = "PLAIN"
            properties[f"listener.name.{listener}.plain.sasl.jaas.config"] = jaas
        return properties

    def _write_config(self) -> Path:
        listeners = [
            f"PLAINTEXT://127.0.0.1:{self.port}",
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
        ]
        advertised = [f"PLAINTEXT://127.0.0.1:{self.port}"]
        sasl: dict[str, str] = {}
        if self.sasl_users:
            listeners += [
                f"SASL://127.0.0.1:{self.sasl_port}",
                f"CONTROLLER_SASL://127.0.0.1:{self.controller_sasl_port}",
            ]
            advertised.append(f"SASL://127.0.0.1:{self.sasl_port}")
            sasl = self._sasl_properties()
        properties = {
            **self.settings,
            **sasl,
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "controller.quorum.bootstrap.servers": self.controller_bootstrap,
            "log.dirs": str(self.directory / "data"),
        }
        config = self.directory / "server.properties"
        config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
        (self.directory / "log4j2.properties").write_text(_LOG4J2.format(log=self.log_file))
        return config

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.shipped_jvm and "JAVA_TOOL_OPTIONS" in env:
            kept = [o for o in env["JAVA_TOOL_OPTIONS"].split() if o not in QUICK_JVM_OPTIONS]
            env["JAVA_TOOL_OPTIONS"] = " ".join(kept)
        return env

    def _java(self, main: str, *args: str) -> list[str]:
        return [
            require_java(),
            *JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={self.directory / 'log4j2.properties'}",
            "-cp",
            classpath("kafka"),
            main,
            *args,
        ]

    def _check_ports(self) -> None:
        """Refuse, naming it, a listener port something already listens on."""
        ports = [("listener", self.port), ("controller listener", self.controller_port)]
        if self.sasl_users:
            ports += [
                ("SASL listener", self.sasl_port),
                ("controller SASL listener", self.controller_sasl_port),
            ]
        for name, port in ports:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                continue
            raise KafkaStartError(f"Kafka's {name} port {port} is taken on 127.0.0.1")

    def _format(self, config: Path) -> None:
        """``kafka-storage.sh format --standalone`` with a fresh cluster id."""
        random_uuid = subprocess.run(
            self._java("kafka.tools.StorageTool", "random-uuid"),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
        self.cluster_id = random_uuid.stdout.strip().splitlines()[-1] if random_uuid.stdout else ""
        formatted = subprocess.run(
            self._java(
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                self.cluster_id,
                "--config",
                str(config),
                "--standalone",
            ),
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
        )
        if random_uuid.returncode or formatted.returncode:
            output = (random_uuid.stderr + formatted.stdout + formatted.stderr)[-3000:]
            raise KafkaStartError(f"Kafka's storage format failed:\n{output}")

    def start(self) -> KafkaNode:
        """Format, start and wait until the broker answers Metadata listing itself; raises
        KafkaStartError with the log's tail otherwise (and removes the directory)."""
        try:
            self._check_ports()
            config = self._write_config()
            self._format(config)
            with (self.directory / "console.log").open("wb") as console:
                self.process = subprocess.Popen(
                    self._java("kafka.Kafka", str(config)),
                    env=self._env(),
                    stdout=console,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL the node (a crash: no controlled shutdown), keeping its data and ports for
        :meth:`restart`."""
        assert self.process is not None, "not started"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=STOP_TIMEOUT_S)

    def restart(self) -> KafkaNode:
        """Start the node again on its data and ports (after :meth:`kill`); wait until it
        answers as before. Kafka recovers its logs and producer state first."""
        assert self.process is not None and self.process.poll() is not None, "still running"
        config = self.directory / "server.properties"
        with (self.directory / "console.log").open("ab") as console:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(config)),
                env=self._env(),
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_ready()
        return self

    def _ready(self) -> bool:
        try:
            with SyncClient(self.bootstrap, timeout=5) as client:
                metadata = client.request(requests.metadata([]))
        except (OSError, EOFError):
            return False
        return any(broker.node_id == NODE_ID for broker in metadata.brokers)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        assert self.process is not None
        while not self._ready():
            if self.process.poll() is not None:
                raise KafkaStartError(
                    f"Kafka exited with {self.process.returncode} while starting:\n"
                    f"{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise KafkaStartError(
                    f"Kafka did not answer on {self.bootstrap} within {START_TIMEOUT_S} s:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        """SIGTERM (Kafka's controlled shutdown), SIGKILL after :data:`STOP_TIMEOUT_S`, then
        remove the temporary directory."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=STOP_TIMEOUT_S)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> KafkaNode:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
