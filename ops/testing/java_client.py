"""The Java client (Kafka's own ``kafka-clients``) as a test driver: ``java/ProducerProbe.java``.

The program is compiled with javac against the class path of the ``kafka`` jar set (which
holds ``kafka-clients`` and log4j 2), once per output folder, and run against any bootstrap
address: pidctl, or Kafka itself as the reference. It prints one ``EVENT {json}`` line per
observation on stdout; the client's own log (``java/log4j2-probe.properties``) comes on
stderr. The producer id a user sees is the client's log line ``ProducerId set to P with epoch
E`` (:func:`ProbeRun.producer_ids`); the program reports the same pair read from the
producer's TransactionManager, with the transaction protocol the client chose.

    classes = compile_probe(tmp_path)
    run = run_probe(classes, "transactional", server.bootstrap, "orders-tx")
    run.events  # [{"event": "initialized", "client": "probe-first", "producer_id": 0, ...}, ...]
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.testing.jars import classpath
from ops.testing.java import compile_java, require_java

JAVA_DIR = Path(__file__).parent / "java"
PROBE_SOURCE = JAVA_DIR / "ProducerProbe.java"
PROBE_LOG_CONFIG = JAVA_DIR / "log4j2-probe.properties"
#: How long one run of the program may take: it bounds each of its blocking calls (30 s,
#: ``max.block.ms``; 60 s for an idempotent producer id) and makes at most a few of them.
RUN_TIMEOUT_S = 300.0
#: The JVM's options: a small heap beside the tests, no hsperfdata files in /tmp.
JVM_OPTIONS = ("-Xmx256m", "-XX:-UsePerfData")

#: The client's log line with the producer id and epoch it was given (TransactionManager;
#: INFO, or DEBUG when transactions v2 bumps the epoch of the same id), after the prefix
#: ``[Producer clientId=C, transactionalId=T]``.
_PRODUCER_ID_SET = re.compile(
    r"\[Producer clientId=([^,\]]+)[^\]]*\] ProducerId set to (-?\d+) with epoch (-?\d+)"
)


class ProbeFailed(RuntimeError):
    """The program exited with an error of its own (not an observation of the server)."""


@dataclass(frozen=True)
class ProbeRun:
    """What one run printed: its events (stdout) and the client's log lines (stderr)."""

    events: list[dict[str, Any]]
    log: list[str]

    def event(self, kind: str, client: str) -> dict[str, Any]:
        """The one event of ``kind`` for ``client`` (``probe-first``, ...)."""
        found = [e for e in self.events if e["event"] == kind and e.get("client") == client]
        if len(found) != 1:
            raise AssertionError(f"{len(found)} {kind!r} events of {client}: {self.events}")
        return found[0]

    def producer_ids(self, client: str) -> list[tuple[int, int]]:
        """Every (producer id, epoch) the client's log says ``client`` was given, in order."""
        return [
            (int(match[2]), int(match[3]))
            for line in self.log
            if (match := _PRODUCER_ID_SET.search(line)) and match[1] == client
        ]

    def log_lines(self, client: str, text: str) -> list[str]:
        """The log lines of ``client`` that contain ``text``."""
        return [line for line in self.log if f"clientId={client}" in line and text in line]


def compile_probe(output_root: Path) -> Path:
    """javac ProducerProbe.java against Kafka's class path into a folder below
    ``output_root`` (reused when compiled from the same inputs); returns that folder."""
    return compile_java([PROBE_SOURCE], classpath("kafka"), output_root)


def run_probe(classes: Path, *args: str, timeout: float = RUN_TIMEOUT_S) -> ProbeRun:
    """Run ProducerProbe with ``args`` (``idempotent BOOTSTRAP`` or ``transactional
    BOOTSTRAP ID``) and return what it printed; ProbeFailed if it exits non-zero."""
    command = [
        require_java(),
        *JVM_OPTIONS,
        f"-Dlog4j2.configurationFile={PROBE_LOG_CONFIG}",
        "-cp",
        f"{classes}:{classpath('kafka')}",
        "ProducerProbe",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise ProbeFailed(
            f"ProducerProbe {' '.join(args)} exited with {done.returncode}:\n"
            f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        )
    events = [
        json.loads(line.removeprefix("EVENT "))
        for line in done.stdout.splitlines()
        if line.startswith("EVENT ")
    ]
    return ProbeRun(events, done.stderr.splitlines())
