"""The deployment assets in ops/deploy/ as Kubernetes would run them, against the image's real
command (its ENTRYPOINT, `pidctl`, with each container's args and environment): every flag
and setting they name exists and parses, the format Job formats the very claim the
StatefulSet's pod mounts, the StatefulSet's pod serves and answers its probes, advertises
the address the manifest gives, and a volume replaced by an empty one stops it rather than
start a new cluster. Paths and ports are moved to the test's (no Kubernetes here)."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ops.testing.coordination import free_port
from ops.testing.serverproc import wait_until
from pidctl.client import SyncClient
from pidctl.controller.cli import build_parser
from pidctl.controller.settings import SETTING_NAMES, load_settings_with_sources
from pidctl.protocol import requests
from pidctl.protocol.addresses import HostPort

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "ops" / "deploy"
#: Each StatefulSet's manifest, and the one that formats its pod 0's data dir first.
WORKLOADS = {
    "kubernetes/pidctl.yaml": "kubernetes/format.yaml",
    "kubernetes-sidecar.yaml": "kubernetes-sidecar-format.yaml",
}
#: What Kubernetes substitutes for $(VAR) in an env value, as it would for pod 0.
POD = {"POD_NAME": "pidctl-0", "POD_NAMESPACE": "default"}
PIDCTL = [sys.executable, "-m", "pidctl.controller.cli"]
#: An older Kubernetes release (1.32, the kubectl on this machine's) and the newest one
#: kubernetes-validate knows: the manifests must be valid for both.
KUBERNETES_VERSIONS = ("1.32.0", kubernetes_validate.latest_version())
MANIFESTS = sorted({*WORKLOADS, *WORKLOADS.values()})


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def of_kind(name: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in documents(name) if d["kind"] == kind]


def image_entrypoint() -> list[str]:
    text = (ROOT / "Dockerfile").read_text()
    [line] = re.findall(r"^ENTRYPOINT (.*)$", text, re.M)
    entrypoint: list[str] = json.loads(line)
    return entrypoint


def readme_image() -> str:
    """The tag the README's `docker build` makes (no tag: latest)."""
    [tag] = re.findall(r"^docker build -t (\S+) \.$", (ROOT / "README.md").read_text(), re.M)
    return tag if ":" in tag else f"{tag}:latest"


@dataclass
class Container:
    manifest: str
    pod: dict[str, Any]  # the pod spec
    spec: dict[str, Any]

    def environ(self) -> dict[str, str]:
        """The container's environment as Kubernetes sets it: $(VAR) of an earlier variable
        substituted (fieldRefs given pod 0's values)."""
        env: dict[str, str] = {}
        for item in self.spec.get("env", []):
            value = item.get("value")
            if value is None:
                value = POD[item["name"]]
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)
        return env

    def ports(self) -> dict[str, int]:
        return {p["name"]: p["containerPort"] for p in self.spec.get("ports", [])}


def pidctl_containers() -> Iterator[Container]:
    for name in sorted({*WORKLOADS, *WORKLOADS.values()}):
        for document in documents(name):
            pod = document["spec"].get("template", {}).get("spec")
            for spec in (pod or {}).get("containers", []) + (pod or {}).get("initContainers", []):
                if spec["image"].split(":")[0] == "pidctl":
                    yield Container(name, pod, spec)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", MANIFESTS)
def test_each_manifest_is_valid_for_kubernetes(name: str, version: str) -> None:
    """Every object validates strictly (no field Kubernetes does not know) against the
    API's schemas of that release, as `kubectl apply --validate=strict` would with a cluster."""
    for document in documents(name):
        kubernetes_validate.validate(document, version, strict=True)


def test_the_schema_check_refuses_a_misspelt_field() -> None:
    """The check above can fail: a probe's name misspelt is an unknown field."""
    [statefulset] = of_kind("kubernetes/pidctl.yaml", "StatefulSet")
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbez"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, KUBERNETES_VERSIONS[-1], strict=True)


def test_every_pidctl_container_runs_the_images_real_flags() -> None:
    """The image the README builds; args the real `pidctl` parses; PIDCTL_* variables that
    are settings and load; the data dir a mounted volume; probes on the metrics port."""
    containers = list(pidctl_containers())
    assert {c.manifest for c in containers} == {*WORKLOADS, *WORKLOADS.values()}
    assert image_entrypoint() == ["pidctl"]
    for container in containers:
        where = f"{container.manifest}: {container.spec['name']}"
        assert container.spec["image"] == readme_image(), where
        args = build_parser().parse_args(container.spec["args"])
        assert args.command in ("serve", "format"), where
        env = container.environ()
        settings = {k.removeprefix("PIDCTL_").lower() for k in env if k.startswith("PIDCTL_")}
        assert settings <= set(SETTING_NAMES), where
        loaded = load_settings_with_sources({}, env)[0]
        mounts = {m["mountPath"]: m["name"] for m in container.spec["volumeMounts"]}
        assert str(loaded.data_dir) in mounts, where
        assert container.spec["securityContext"]["runAsUser"] == 10001
        assert container.pod["securityContext"]["fsGroup"] == 10001  # the volume writable
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if args.command == "serve":
                port = container.spec[probe]["httpGet"]["port"]
                assert container.ports()[port] == loaded.metrics_listen.port, (where, probe)
        if "kafka" in container.ports():
            assert container.ports()["kafka"] == loaded.listen.port


def _serving(container: Container, data_dir: Path) -> tuple[dict[str, str], int, int]:
    """The container's environment with its data dir and ports moved to the test's."""
    env = container.environ()
    port, metrics = free_port(), free_port()
    listen = HostPort.parse(env["PIDCTL_LISTEN"])
    env["PIDCTL_DATA_DIR"] = str(data_dir)
    env["PIDCTL_LISTEN"] = f"127.0.0.1:{port}"  # 0.0.0.0 is for the pod's network only
    env["PIDCTL_METRICS_LISTEN"] = f"127.0.0.1:{metrics}"
    if "PIDCTL_ADVERTISED_LISTENER" in env:
        written = f":{listen.port}"
        assert env["PIDCTL_ADVERTISED_LISTENER"].endswith(written)
        env["PIDCTL_ADVERTISED_LISTENER"] = env["PIDCTL_ADVERTISED_LISTENER"][: -len(written)]
        env["PIDCTL_ADVERTISED_LISTENER"] += f":{port}"
    return env, port, metrics


def _run(container: Container, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIDCTL_")}
    return subprocess.run(
        [*PIDCTL, *container.spec["args"]],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def _answers_200(url: str) -> bool:
    return _status(url) == 200


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_the_statefulset_starts_on_what_its_format_job_made(workload: str, tmp_path: Path) -> None:
    """The format Job's claim is the one the StatefulSet's template gives pod 0; the Job's
    command formats it, the pod's command then serves it: each probe answers 200 once ready,
    and Metadata gives the advertised address the manifest builds. Applied again the Job
    refuses, changing nothing."""
    [statefulset] = of_kind(workload, "StatefulSet")
    [job] = of_kind(WORKLOADS[workload], "Job")
    [claim] = of_kind(WORKLOADS[workload], "PersistentVolumeClaim")
    pod = statefulset["spec"]["template"]["spec"]
    assert "initContainers" not in pod  # nothing in the pod formats
    [server] = [
        c for c in pidctl_containers() if c.manifest == workload and c.spec in pod["containers"]
    ]
    [formatter] = [c for c in pidctl_containers() if c.manifest == WORKLOADS[workload]]
    # The claim: <template>-<statefulset>-0, of the template mounted at the data dir.
    data_dir = server.environ()["PIDCTL_DATA_DIR"]
    [template] = [m["name"] for m in server.spec["volumeMounts"] if m["mountPath"] == data_dir]
    assert claim["metadata"]["name"] == f"{template}-{statefulset['metadata']['name']}-0"
    [volume] = job["spec"]["template"]["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    templates = {
        t["metadata"]["name"]: t["spec"] for t in statefulset["spec"]["volumeClaimTemplates"]
    }
    assert claim["spec"] == templates[template]
    job_env = formatter.environ()
    assert job_env["PIDCTL_DATA_DIR"] == data_dir
    assert job_env["PIDCTL_NODE_ID"] == server.environ()["PIDCTL_NODE_ID"]
    # The headless Service the StatefulSet names selects its pods.
    services = {s["metadata"]["name"]: s for s in of_kind(workload, "Service")}
    service = services[statefulset["spec"]["serviceName"]]
    assert service["spec"]["clusterIP"] == "None"
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    container_ports = {
        n for c in pod["containers"] for n in (p["name"] for p in c.get("ports", []))
    }
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports

    volume_dir = tmp_path / "volume"
    volume_dir.mkdir()  # a new volume: the mount point exists, empty
    formatted = _run(formatter, {**job_env, "PIDCTL_DATA_DIR": str(volume_dir)})
    assert formatted.returncode == 0, formatted.stderr
    env, port, metrics = _serving(server, volume_dir)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIDCTL_")}
    proc = subprocess.Popen(
        [*PIDCTL, *server.spec["args"]],
        env={**clean, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{metrics}"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            path = server.spec[probe]["httpGet"]["path"]
            wait_until(functools.partial(_answers_200, base + path), f"{workload}: {path}")
        with SyncClient(f"127.0.0.1:{port}") as client:
            [node] = client.request(requests.metadata([])).brokers
        written = server.environ().get(
            "PIDCTL_ADVERTISED_LISTENER", server.environ()["PIDCTL_LISTEN"]
        )
        assert f"{node.host}" == HostPort.parse(written).host
        if workload == "kubernetes/pidctl.yaml":
            name, namespace = POD["POD_NAME"], POD["POD_NAMESPACE"]
            assert (
                node.host == f"{name}.{service['metadata']['name']}.{namespace}.svc.cluster.local"
            )
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    again = _run(formatter, {**job_env, "PIDCTL_DATA_DIR": str(volume_dir)})
    assert again.returncode == 1 and "already formatted" in again.stderr
    assert job["spec"]["backoffLimit"] == 0


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_a_replaced_volume_stops_the_pod(workload: str, tmp_path: Path) -> None:
    """An empty volume where the data was (a claim deleted and made again): the pod's
    command exits 2 saying the data dir is not formatted, and makes nothing."""
    [statefulset] = of_kind(workload, "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    [server] = [
        c for c in pidctl_containers() if c.manifest == workload and c.spec in pod["containers"]
    ]
    empty = tmp_path / "volume"
    empty.mkdir()
    (empty / "lost+found").mkdir()
    env, _, _ = _serving(server, empty)
    refused = _run(server, env)
    assert refused.returncode == 2
    [line] = refused.stderr.splitlines()
    assert line.startswith(f"pidctl: data dir {empty} holds no metadata log: create it with")
    assert sorted(p.name for p in empty.iterdir()) == ["lost+found"]


def test_prometheus_scrapes_and_alerts_on_pidctl() -> None:
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert any(job["job_name"] == "pidctl" for job in prometheus["scrape_configs"])
    alerts = yaml.safe_load((DEPLOY / "pidctl-alerts.yml").read_text())
    names = {rule["alert"] for group in alerts["groups"] for rule in group["rules"]}
    assert "PidctlProducerIdsRunningOut" in names
