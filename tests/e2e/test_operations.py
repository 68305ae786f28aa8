"""pidctl as operators run it: the README's and the Dockerfile's start commands, metrics and
health over HTTP, graceful shutdown under load, the deployment examples."""

from __future__ import annotations

import json
import os
import platform
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import kafka

from ops.bench.core import build_history
from ops.testing.coordination import free_port
from ops.testing.serverproc import (
    WITHOUT_HYPOTHESIS,
    ServerProcess,
    format_data_dir,
    stored_cluster_id,
)
from pidctl.client import SyncClient
from pidctl.protocol import requests
from tests import docs, wire

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
PIDCTL = [sys.executable, "-m", "pidctl.controller.cli"]


def scrape(url: str) -> dict[str, float]:
    """Prometheus text format to {'name{labels}': value}, comments skipped."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def http_status(url: str) -> int:
    try:
        return int(urllib.request.urlopen(url, timeout=5).status)
    except urllib.error.HTTPError as e:
        return e.code


def wait_for(url: str, status: int = 200, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if http_status(url) == status:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} never answered {status}"
        time.sleep(0.1)


def dockerfile() -> tuple[dict[str, str], list[str], list[str]]:
    """The Dockerfile's ENV, its ENTRYPOINT + CMD, and its HEALTHCHECK command."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    command: list[str] = []
    health: list[str] = []
    for line in text.splitlines():
        keyword, _, rest = line.strip().partition(" ")
        if keyword == "ENV":
            env.update(dict(pair.split("=", 1) for pair in shlex.split(rest)))
        elif keyword in ("ENTRYPOINT", "CMD"):
            command += json.loads(rest)
        elif keyword == "HEALTHCHECK":
            health = json.loads(rest.split(" CMD ", 1)[1])
    return env, command, health


def drive_traffic(bootstrap: str) -> None:
    with SyncClient(bootstrap) as client:
        cluster = client.request(requests.metadata([])).cluster_id
        epoch = wire.register(client, 1, cluster)
        client.pipeline([wire.allocate(1, epoch)] * 3 + [requests.init_producer_id()] * 5)
        client.request(wire.allocate(1, epoch + 99))  # a STALE_BROKER_EPOCH


def check_metrics_follow_traffic(bootstrap: str, metrics_url: str) -> None:
    assert http_status(metrics_url + "/healthz") == 200
    wait_for(metrics_url + "/readyz")
    before = scrape(metrics_url)
    drive_traffic(bootstrap)
    after = scrape(metrics_url)
    allocate = 'pidctl_requests_total{api="allocate_producer_ids",version="0"}'
    assert after[allocate] - before.get(allocate, 0) == 4
    stale = (
        'pidctl_request_errors_total{api="allocate_producer_ids",'
        'error="STALE_BROKER_EPOCH",version="0"}'
    )
    assert after[stale] == 1
    assert after["pidctl_next_producer_id"] >= before["pidctl_next_producer_id"] + 4000
    assert after["pidctl_log_appended_records_total"] > before["pidctl_log_appended_records_total"]
    assert after['pidctl_producer_id_blocks_granted_total{broker="1",holder="broker"}'] == 3
    assert after["pidctl_registered_brokers"] == 1
    assert after["pidctl_connections_accepted_total"] > before["pidctl_connections_accepted_total"]
    assert after["pidctl_received_bytes_total"] > before["pidctl_received_bytes_total"]
    assert after['pidctl_request_duration_seconds_count{api="init_producer_id"}'] == 5
    assert after["pidctl_log_fsync_duration_seconds_count"] > 0


def check_answered_by(bootstrap: str, data_dir: Path) -> None:
    """The server on these ports is the one on ``data_dir`` (its cluster id over the wire),
    not some other server on the machine."""
    with SyncClient(bootstrap) as client:
        assert client.request(requests.metadata([])).cluster_id == stored_cluster_id(data_dir)


def test_readme_command_serves_metrics_and_readiness(tmp_path: Path) -> None:
    """`ops/dev.sh serve`, as the README says, on its embedded defaults except the ports
    (free ones: the user's own server may hold 9093 and 9464): it formats ./pidctl-data on
    first use and says so, and serves from it, without hypothesis (which the venv has)."""
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "VENV": str(VENV_BIN.parent)}
    env.pop("PIDCTL_DATA_DIR", None)
    env.pop("PYTHONPATH", None)  # as a user's shell has it: not the test session's
    ports = ["--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}"]
    proc = subprocess.Popen(
        [str(ROOT / "ops" / "dev.sh"), "serve", *ports],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    bootstrap, metrics_url = f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}"
    try:
        wait_for(metrics_url + "/readyz")
        check_answered_by(bootstrap, tmp_path / "pidctl-data")
        check_metrics_follow_traffic(bootstrap, metrics_url)
        # (dev.sh execs pidctl: its process is the server.)
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        path = next(v for v in environ if v.startswith(b"PYTHONPATH=")).split(b"=", 1)[1]
        assert path.decode().split(os.pathsep)[0] == str(WITHOUT_HYPOTHESIS)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert proc.stdout is not None
    said = proc.stdout.read()
    assert said.startswith("formatted pidctl-data (it did not exist"), said


def test_serve_refuses_a_data_dir_that_is_not_formatted(tmp_path: Path) -> None:
    """A missing or empty data dir (a wrong working directory, a typo, a volume not
    mounted) stops `pidctl serve` with exit 2 and one line saying how to create one; it
    creates nothing."""
    empty = tmp_path / "mounted"
    empty.mkdir()
    for data_dir in (tmp_path / "typo", empty):
        result = subprocess.run(
            [
                *PIDCTL,
                "serve",
                "--data-dir",
                str(data_dir),
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2
        [line] = result.stderr.strip().splitlines()
        assert line.startswith(f"pidctl: data dir {data_dir} ")
        assert f"`pidctl format --data-dir {data_dir}`" in line
    assert not (tmp_path / "typo").exists() and list(empty.iterdir()) == []


def test_format_once_then_serve(tmp_path: Path) -> None:
    """`pidctl format` makes a data dir (of a given cluster id) and refuses to make it twice
    unless told to ignore it; a directory holding other files is refused."""
    data_dir = tmp_path / "d"
    made = subprocess.run(
        [*PIDCTL, "format", "--data-dir", str(data_dir), "--cluster-id", "c0ffee"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout == f"formatted {data_dir}: cluster id c0ffee, node id 1\n"
    again = subprocess.run(
        [*PIDCTL, "format", "--data-dir", str(data_dir)], capture_output=True, text=True
    )
    assert again.returncode == 1
    assert again.stderr == (
        f"pidctl: {data_dir} is already formatted (cluster id c0ffee); nothing done\n"
    )
    ignored = subprocess.run(
        [*PIDCTL, "format", "--data-dir", str(data_dir), "--ignore-formatted"],
        capture_output=True,
        text=True,
    )
    assert ignored.returncode == 0 and "already formatted" in ignored.stdout
    other = tmp_path / "home"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    refused = subprocess.run(
        [*PIDCTL, "format", "--data-dir", str(other)], capture_output=True, text=True
    )
    assert refused.returncode == 1 and "not empty (notes.txt)" in refused.stderr
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt"]
    with ServerProcess(data_dir, format=False) as server:
        assert server.cluster_id() == "c0ffee"
        with SyncClient(server.bootstrap) as client:
            assert wire.register(client, 1, "c0ffee") == 2  # offsets 0, 1: created, started


def test_a_failed_first_start_leaves_no_data_dir(tmp_path: Path) -> None:
    """`ops/dev.sh serve` formats ./pidctl-data on first use; if that start fails (its port
    is taken) the data dir it made is removed again."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [
                str(ROOT / "ops" / "dev.sh"),
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--metrics-listen",
                "127.0.0.1:0",
            ],
            cwd=tmp_path,
            env={**os.environ, "VENV": str(VENV_BIN.parent)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert not (tmp_path / "pidctl-data").exists()


def docker_runs() -> list[tuple[dict[str, str], list[str]]]:
    """Each `docker run` of the README's Docker commands: its `-e` variables, and the
    arguments after the image (none: the image's CMD)."""
    runs = []
    for line in docs.commands(docs.block("README.md", "Install", 1)):
        argv = shlex.split(line)
        if argv[:2] != ["docker", "run"]:
            continue
        env, at = {}, 2
        while argv[at].startswith("-"):
            if argv[at] == "--rm":
                at += 1
                continue
            if argv[at] == "-e":
                name, value = argv[at + 1].split("=", 1)
                env[name] = value
            at += 2
        assert argv[at] == "pidctl", argv  # the image the README's `docker build` tags
        runs.append((env, argv[at + 1 :]))
    return runs


def test_dockerfile_entrypoint_outside_docker(tmp_path: Path) -> None:
    """The image's commands as the README gives them: `format` once, then its ENTRYPOINT +
    CMD with the `docker run`'s variables, with the Dockerfile's ENV (the data dir moved
    into a temporary directory, as there is no Docker engine here, and the ports free ones,
    the same inside and out as `-p P:P` makes them), then its HEALTHCHECK. Without the
    advertised address the README sets, the container would exit 2 saying why: it listens
    on 0.0.0.0, and clients reconnect to the address it advertises."""
    env, command, health = dockerfile()
    assert command == ["pidctl", "serve"] and env["PIDCTL_DATA_DIR"] == "/data"
    (format_env, format_args), (serve_env, serve_args) = docker_runs()
    assert format_args == ["format"] and format_env == {} and serve_args == []
    port, metrics_port = free_port(), free_port()
    assert env["PIDCTL_LISTEN"] == "0.0.0.0:9093"
    assert env["PIDCTL_METRICS_LISTEN"] == "0.0.0.0:9464"
    assert serve_env == {"PIDCTL_ADVERTISED_LISTENER": "localhost:9093"}
    env["PIDCTL_DATA_DIR"] = str(tmp_path / "data")
    env["PIDCTL_LISTEN"] = f"0.0.0.0:{port}"
    env["PIDCTL_METRICS_LISTEN"] = f"127.0.0.1:{metrics_port}"
    health = [part.replace(":9464/", f":{metrics_port}/") for part in health]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIDCTL_")}
    run_env = {**clean, **env, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    served_env = {**run_env, "PIDCTL_ADVERTISED_LISTENER": f"localhost:{port}"}
    unformatted = subprocess.run(command, env=served_env, capture_output=True, text=True)
    assert unformatted.returncode == 2 and "pidctl format" in unformatted.stderr
    formatted = subprocess.run(
        [command[0], *format_args], env=run_env, capture_output=True, text=True
    )
    assert formatted.returncode == 0, formatted.stderr
    unadvertised = subprocess.run(command, env=run_env, capture_output=True, text=True)
    assert unadvertised.returncode == 2
    assert "advertised_listener: required when listening on the wildcard address" in (
        unadvertised.stderr
    )
    proc = subprocess.Popen(command, env=served_env, stderr=subprocess.DEVNULL, text=True)
    bootstrap, metrics_url = f"localhost:{port}", f"http://127.0.0.1:{metrics_port}"
    try:
        wait_for(metrics_url + "/readyz")
        assert health[0] == "python"
        assert subprocess.run([sys.executable, *health[1:]], timeout=10).returncode == 0
        check_answered_by(bootstrap, tmp_path / "data")
        with SyncClient(bootstrap) as client:
            [node] = client.request(requests.metadata([])).brokers
        assert (node.host, node.port) == ("localhost", port)  # what clients reconnect to
        check_metrics_follow_traffic(bootstrap, metrics_url)
        # A producer outside the container follows Metadata to the advertised address.
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, transactional_id="docker")
        try:
            producer.init_transactions()
            assert producer._transaction_manager.producer_id_and_epoch.epoch == 0
        finally:
            producer.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    # After shutdown the health check fails, as it must.
    assert (
        subprocess.run(
            [sys.executable, *health[1:]], timeout=10, stderr=subprocess.DEVNULL
        ).returncode
        != 0
    )


def test_dockerfile_lints_clean() -> None:
    result = subprocess.run(
        [str(VENV_BIN / "hadolint"), str(ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_readyz_is_503_while_the_log_recovers(tmp_path: Path) -> None:
    """A long log without snapshots takes a while to replay: /healthz answers at once,
    /readyz says 503 until recovery is done and the listener is bound, then 200."""
    data_dir = tmp_path / "d"
    build_history(data_dir, 200_000, snapshot_interval_records=10**9)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    server = ServerProcess(data_dir, "--metrics-listen", f"127.0.0.1:{metrics_port}")
    proc = subprocess.Popen(server.command(), stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{metrics_port}"
    seen: list[int] = []
    try:
        wait_for(url + "/healthz")
        deadline = time.monotonic() + 60
        while not seen or seen[-1] != 200:
            assert time.monotonic() < deadline
            seen.append(http_status(url + "/readyz"))
            time.sleep(0.01)
        assert http_status(url + "/nope") == 404
    finally:
        proc.kill()
        proc.wait()
    assert seen[0] == 503 and seen[-1] == 200


def test_sigterm_under_load_loses_no_acknowledged_grant(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "d").start()
    cluster = server.cluster_id()
    acked: list[int] = []
    lock = threading.Lock()

    def broker(broker_id: int) -> None:
        try:
            with SyncClient(server.bootstrap) as client:
                epoch = wire.register(client, broker_id, cluster)
                while True:
                    for r in client.pipeline([wire.allocate(broker_id, epoch)] * 4):
                        assert r.error_code == 0
                        with lock:
                            acked.append(r.producer_id_start)
        except (ConnectionError, OSError):
            return

    threads = [threading.Thread(target=broker, args=(b,)) for b in range(1, 9)]
    for t in threads:
        t.start()
    time.sleep(random.uniform(0.5, 1.0))
    assert server.terminate() == 0
    for t in threads:
        t.join(30)
    assert acked, "no grant was acknowledged before SIGTERM"
    stopped = server.event("stopped")
    assert stopped["level"] == "info"
    server.start()
    try:
        with SyncClient(server.bootstrap) as client:
            epoch = wire.register(client, 99, cluster)
            nxt = client.request(wire.allocate(99, epoch))
    finally:
        server.kill()
    assert nxt.producer_id_start >= max(acked) + 1000


def test_status_and_config_show(server: ServerProcess) -> None:
    registered = subprocess.run(
        [
            sys.executable,
            "-m",
            "pidctl.controller.cli",
            "register",
            "--bootstrap",
            server.bootstrap,
            "--broker-id",
            "4",
            "--listener",
            "PLAINTEXT://kafka-4:9092",
            "--rack",
            "r1",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert registered.returncode == 0, registered.stderr
    status = subprocess.run(
        [sys.executable, "-m", "pidctl.controller.cli", "status", "--bootstrap", server.bootstrap],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert status.returncode == 0
    assert f"cluster id:  {server.cluster_id()}" in status.stdout
    assert "node id:     1" in status.stdout
    assert re.search(r"ALLOCATE_PRODUCER_IDS\s+67\s+v0-v0", status.stdout)
    assert re.search(r"broker 4\s+kafka-4:9092\s+fenced", status.stdout)
    shown = subprocess.run(
        [sys.executable, "-m", "pidctl.controller.cli", "config", "show", "--node-id", "9"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PIDCTL_LOG_LEVEL": "debug"},
    )
    assert "node_id = 9  # --node-id" in shown.stdout
    assert 'log_level = "debug"  # PIDCTL_LOG_LEVEL' in shown.stdout
    assert "max_frame_bytes = 1048576  # default" in shown.stdout


def test_describe_cluster_lists_registered_brokers(server: ServerProcess) -> None:
    with SyncClient(server.bootstrap) as client:
        cluster = server.cluster_id()
        registration = requests.registration(
            5, cluster, uuid.uuid4(), listeners=("PLAINTEXT://kafka-5:9092",)
        )
        epoch = client.request(registration).broker_epoch
        fenced_only = client.request(requests.describe_cluster(include_fenced_brokers=False))
        client.request(wire.heartbeat(5, epoch))
        active = client.request(requests.describe_cluster(include_fenced_brokers=False))
        controllers = client.request(requests.describe_cluster(endpoint_type=2))
    assert fenced_only.brokers == ()  # registered brokers start fenced
    [broker] = active.brokers
    assert (broker.broker_id, broker.host, broker.port, broker.is_fenced) == (
        5,
        "kafka-5",
        9092,
        False,
    )
    assert active.cluster_id == cluster and active.controller_id == 1
    assert [c.broker_id for c in controllers.brokers] == [1]


#: What Kubernetes puts into every pod of a namespace with a Service named pidctl (service
#: links on, the default), with a named port and a second Service, pidctl-metrics.
SERVICE_LINKS = {
    "PIDCTL_SERVICE_HOST": "10.96.0.11",
    "PIDCTL_SERVICE_PORT": "9093",
    "PIDCTL_SERVICE_PORT_PIDCTL": "9093",
    "PIDCTL_PORT": "tcp://10.96.0.11:9093",
    "PIDCTL_PORT_9093_TCP": "tcp://10.96.0.11:9093",
    "PIDCTL_PORT_9093_TCP_PROTO": "tcp",
    "PIDCTL_PORT_9093_TCP_PORT": "9093",
    "PIDCTL_PORT_9093_TCP_ADDR": "10.96.0.11",
    "PIDCTL_METRICS_SERVICE_HOST": "10.96.0.12",
    "PIDCTL_METRICS_SERVICE_PORT": "9464",
    "PIDCTL_METRICS_PORT": "tcp://10.96.0.12:9464",
    "PIDCTL_METRICS_PORT_9464_TCP": "tcp://10.96.0.12:9464",
    "PIDCTL_METRICS_PORT_9464_TCP_PROTO": "tcp",
    "PIDCTL_METRICS_PORT_9464_TCP_PORT": "9464",
    "PIDCTL_METRICS_PORT_9464_TCP_ADDR": "10.96.0.12",
}


def test_a_pod_with_kubernetes_service_links_starts(tmp_path: Path) -> None:
    """The real server with every service-link variable set starts, serves, and names
    what it ignored in one warning; the settings are untouched by them."""
    with ServerProcess(tmp_path / "d", env=SERVICE_LINKS) as server:
        warning = server.event(
            "ignored Kubernetes service-link variables (not settings; enableServiceLinks: "
            "false in the pod spec drops them)"
        )
        assert warning["level"] == "warning" and warning["variables"] == sorted(SERVICE_LINKS)
        with SyncClient(server.bootstrap) as client:
            assert client.request(requests.init_producer_id()).error_code == 0
    shown = subprocess.run(
        [*PIDCTL, "config", "show"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **SERVICE_LINKS},
    )
    assert shown.returncode == 0 and "PIDCTL_PORT" not in shown.stdout


def test_what_an_operator_sees_from_the_first_scrape(tmp_path: Path) -> None:
    """The first log line says what starts; /metrics has the build and the process from the
    first scrape, and the snapshot age counts from the data dir's formatting until a first
    snapshot, across restarts (a restart shows as a new process start time)."""
    data_dir = tmp_path / "d"
    formatting = time.time()
    format_data_dir(data_dir)
    formatted = time.time()
    starts = []
    for _ in range(2):
        with ServerProcess(data_dir) as server:
            first = server.events[0]
            assert first["event"] == "pidctl starting"
            running = "compiled" if os.environ.get("TEST_BUILD") == "compiled" else "interpreted"
            assert first["build"] == running
            assert server.proc is not None and first["pid"] == server.proc.pid
            assert first["data_dir"] == str(data_dir.resolve())
            before = time.time()
            samples = scrape(server.metrics_url)
            after = time.time()
        assert any(name.startswith("pidctl_build_info{") for name in samples)
        assert samples["process_resident_memory_bytes"] > 0 and samples["process_open_fds"] > 0
        starts.append(samples["process_start_time_seconds"])
        # Counted from the ClusterCreated record, written between `formatting` and `formatted`.
        age = samples["pidctl_snapshot_age_seconds"]
        assert before - formatted - 0.01 <= age <= after - formatting + 0.01
    assert starts[1] > starts[0]


def test_version_and_a_password_prompt_without_a_terminal(tmp_path: Path) -> None:
    from pidctl.protocol import __version__

    version = subprocess.run([*PIDCTL, "--version"], capture_output=True, text=True, timeout=60)
    how = "compiled by mypyc" if os.environ.get("TEST_BUILD") == "compiled" else "interpreted"
    python = f"{platform.python_implementation()} {platform.python_version()}"
    assert (version.returncode, version.stdout) == (0, f"pidctl {__version__} ({how}; {python})\n")
    users = tmp_path / "users.json"
    added = subprocess.run(
        [*PIDCTL, "users", "add", "--credentials-file", str(users), "--user", "app"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 2 and not users.exists()
    assert added.stderr == (
        "pidctl: no terminal to ask for the password: pipe it in with --password-stdin\n"
    )
