"""Health probes a flood cannot starve: /healthz and /readyz answer at once beside a thousand
connections held open to the metrics port, as the shipped Kubernetes manifest and
Dockerfile probe them. A real server, real sockets, the manifest and Dockerfile as shipped."""

from __future__ import annotations

import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from ops.testing.serverproc import ServerProcess, wait_until
from tests.docs import ROOT
from tests.e2e.test_operations import dockerfile, scrape
from tests.e2e.test_storage_faults import HttpFlood

#: The flood: connections to the metrics port held open without a request.
HELD = 1000
#: What the issue asks of /healthz beside them.
PROBE_BOUND_S = 0.100


def _probe(port: int, path: str, timeout: float) -> tuple[int, float]:
    """One GET as a probe sends it: the status (0: no answer in time) and the seconds."""
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: probe\r\n\r\n".encode())
            answer = b""
            while data := sock.recv(4096):
                answer += data
    except OSError:
        return 0, time.monotonic() - started
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
    return status, time.monotonic() - started


def _flooded(server: ServerProcess, flood: HttpFlood) -> None:
    """Wait until the flood's connections are open and the endpoint has taken them (the
    endpoint full, the rest closed for newer ones)."""
    wait_until(lambda: flood.opened >= HELD, "the flood's connections")
    wait_until(
        lambda: scrape_evicted(server) >= HELD - 32,
        "the endpoint taking the flood",
    )


def scrape_evicted(server: ServerProcess) -> float:
    status, _ = _probe(server.metrics_port, "/healthz", 5)  # (a scrape would count as one)
    assert status == 200
    samples = scrape(server.metrics_url)
    return samples.get('pidctl_http_connections_evicted_total{reason="full"}', 0.0)


def test_healthz_answers_within_100_ms_beside_1000_held_metrics_connections(
    tmp_path: Path,
) -> None:
    """64 connections held open to the metrics port filled metrics_max_connections (32) and
    the backlog: 6 of 6 /healthz probes timed out, and the shipped liveness probe restarted
    the controller again and again."""
    with ServerProcess(tmp_path / "d") as server, HttpFlood(server.metrics_port, HELD) as flood:
        _flooded(server, flood)
        probes = []
        for _ in range(20):
            probes.append(_probe(server.metrics_port, "/healthz", 2.0))
            time.sleep(0.05)  # pacing the probes, not waiting for anything
        ready = _probe(server.metrics_port, "/readyz", 2.0)
    assert [status for status, _ in probes] == [200] * 20
    slowest = max(seconds for _, seconds in probes)
    assert slowest < PROBE_BOUND_S, slowest
    assert ready[0] == 200


#: The shipped manifests with a pidctl container: a sidecar pod, and a StatefulSet.
MANIFESTS = ("ops/deploy/kubernetes-sidecar.yaml", "ops/deploy/kubernetes/pidctl.yaml")


def _manifest_probes() -> dict[str, dict[str, object]]:
    """Every probe of every shipped manifest's pidctl container, by manifest and kind."""
    probes = {}
    for manifest in MANIFESTS:
        for document in yaml.safe_load_all((ROOT / manifest).read_text()):
            spec = (document or {}).get("spec", {})
            pod = spec.get("template", {}).get("spec", spec)
            for container in pod.get("containers", []):
                if container["name"] != "pidctl":
                    continue
                for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
                    if kind in container:
                        probes[f"{manifest} {kind}"] = container[kind]
    return probes


def _healthcheck_timeout() -> float:
    """The Dockerfile's HEALTHCHECK --timeout, in seconds."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    match = re.search(r"^HEALTHCHECK .*--timeout=(\d+)s", text, re.M)
    assert match is not None, "the Dockerfile's HEALTHCHECK has a --timeout"
    return float(match.group(1))


def test_the_shipped_probes_pass_beside_a_flood_of_held_connections(tmp_path: Path) -> None:
    """Kubernetes' probes as the manifest sets them (its timeoutSeconds, 1 s by default, and
    failureThreshold, 3 by default, failures in a row restart the container) and Docker's
    HEALTHCHECK command as the Dockerfile runs it, beside the flood."""
    probes = _manifest_probes()
    assert len(probes) >= 5  # (the sidecar's two, the StatefulSet's three)
    _, _, healthcheck = dockerfile()
    with ServerProcess(tmp_path / "d") as server, HttpFlood(server.metrics_port, HELD) as flood:
        _flooded(server, flood)
        for kind, probe in probes.items():
            get = probe["httpGet"]
            assert isinstance(get, dict) and get["port"] == "metrics"
            timeout = float(probe.get("timeoutSeconds", 1))  # type: ignore[arg-type]
            threshold = int(probe.get("failureThreshold", 3))  # type: ignore[call-overload]
            outcomes = [_probe(server.metrics_port, get["path"], timeout) for _ in range(threshold)]
            assert [status for status, _ in outcomes] == [200] * threshold, (kind, outcomes)
        # Docker's: the command as written, at this server's port (not the default's).
        command = [
            arg.replace("127.0.0.1:9464", f"127.0.0.1:{server.metrics_port}") for arg in healthcheck
        ]
        assert command[0] == "python"
        ran = subprocess.run(
            [sys.executable, *command[1:]], timeout=_healthcheck_timeout(), capture_output=True
        )
        assert ran.returncode == 0, shlex.join(command) + "\n" + ran.stderr.decode()
