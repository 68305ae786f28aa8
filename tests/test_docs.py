"""The README and docs/ match what runs: every fenced block is run by a test as written (its
addresses, ports and paths moved to the test's own), or is listed here with the reason it is
not (it is the test suite itself, takes an hour, needs a Docker engine, is a log excerpt).
A new block fails :func:`test_every_block_is_run_or_says_why_not` until it is listed."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from kazoo.client import KazooClient

from ops import configuration_doc
from ops.testing.coordination import EtcdProcess, ZooKeeperProcess, free_port
from ops.testing.serverproc import ServerProcess, add_sasl_user, stored_cluster_id, wait_until
from pidctl.client import SyncClient
from pidctl.controller.cli import build_parser
from pidctl.controller.core.acl import Authorizer, parse_acl
from pidctl.controller.core.records import RECORD_TYPES
from pidctl.controller.settings import SETTING_NAMES, SettingsError, load_settings_with_sources
from pidctl.protocol import requests
from tests import docs

ROOT = docs.ROOT
VENV_BIN = Path(sys.executable).parent


def run_by(test: str) -> str:
    return f"run by {test}"


def not_run(reason: str) -> str:
    return f"not run: {reason}"


#: Every block of the README and docs/, by (file, heading above it, its number there).
BLOCKS = {
    ("README.md", "Install", 0): run_by(
        "tests/test_release.py::release (the fixture every test of that module uses)"
        " and tests/test_release.py::test_the_installed_wheel_says_which_build_it_is"
    ),
    ("README.md", "Install", 1): run_by(
        "tests/e2e/test_operations.py::test_dockerfile_entrypoint_outside_docker (no Docker"
        " engine here: the image's ENV, ENTRYPOINT and CMD with each `docker run`'s -e and"
        " arguments, the volume a folder, the ports free ones)"
    ),
    ("README.md", "Install", 2): not_run(
        "no Kubernetes here: tests/ops/test_deploy.py runs each manifest's containers as"
        " Kubernetes would (the format Job, then the StatefulSet's pod and its probes)"
    ),
    ("README.md", "Run", 0): run_by("tests/test_docs.py::test_run_as_written"),
    ("docs/connection-states.md", "A connection's states", 0): not_run(
        "a Mermaid diagram, not a command: tests/ops/test_connection_states.py checks it is"
        " the one ops/connection_states.py draws, and tests/protocol/test_server.py drives a"
        " connection through each change"
    ),
    ("README.md", "Quick start", 0): run_by("tests/test_docs.py::test_quick_start_as_written"),
    ("README.md", "Quick start", 1): run_by("tests/test_docs.py::test_quick_start_as_written"),
    ("README.md", "Exactly once you can watch", 0): run_by(
        "tests/ops/test_demo.py::test_the_demo_shows_spark_duplicating_and_pidctl_kafka_not"
    ),
    ("README.md", "Exactly once you can watch", 1): run_by(
        "tests/ops/test_demo.py::test_the_demo_shows_spark_duplicating_and_pidctl_kafka_not"
        " (the demo's output, its counts as measured)"
    ),
    ("README.md", "Spark, exactly once", 0): run_by(
        "tests/ops/spark/test_readme_examples.py::test_the_examples_run_as_written"
    ),
    ("README.md", "Spark, exactly once", 1): run_by(
        "tests/ops/spark/test_kafka_examples.py::test_example_runs_and_writes_every_row_once"
        " (in the test session's SparkSession)"
    ),
    ("docs/getting-started.md", "From a checkout", 0): run_by(
        "tests/test_docs.py::dev_server (the fixture of test_quick_start_as_written)"
    ),
    ("docs/getting-started.md", "The audit trail", 0): run_by(
        "tests/test_docs.py::test_quick_start_as_written (on the quick start's data dir)"
    ),
    ("docs/configuration.md", "Configuration", 0): run_by(
        "tests/test_docs.py::test_config_show_as_written"
    ),
    ("docs/operations.md", "Kubernetes", 0): not_run(
        "no Kubernetes here: tests/ops/test_deploy.py runs each manifest's containers as"
        " Kubernetes would (the format Job, then the StatefulSet's pod and its probes)"
    ),
    ("docs/security.md", "Security", 0): run_by(
        "tests/test_docs.py::test_the_security_configuration_as_written"
    ),
    ("docs/quotas-and-reloads.md", "Reloads (SIGHUP)", 0): run_by(
        "tests/test_docs.py::test_the_reloadable_acls_as_written"
    ),
    ("docs/job-allocations.md", "Owners and ACLs", 0): run_by(
        "tests/test_docs.py::test_the_app_id_acl_as_written"
    ),
    ("docs/durability.md", "Durability: what the log promises under faults", 0): not_run(
        "the campaign at its defaults takes about an hour; each kind of fault it makes is a"
        " test of tests/e2e/test_storage_faults.py and test_crash.py, and a small campaign"
        " runs in tests/ops/test_bench.py::test_a_small_fault_campaign_finds_nothing_lost"
    ),
    ("docs/fleets.md", "Running a fleet", 0): run_by(
        "tests/test_docs.py::test_the_fleet_and_the_import_as_written"
    ),
    ("docs/fleets.md", "Migrating from ZooKeeper (KIP-730)", 0): run_by(
        "tests/test_docs.py::test_the_fleet_and_the_import_as_written"
    ),
    ("docs/fleets.md", "Transactions", 0): not_run("the shape of an etcd transaction, not code"),
    ("docs/broker-library.md", "The broker library (`pidctl.broker`)", 0): run_by(
        "tests/test_docs.py::test_the_broker_side_example_as_written"
    ),
    ("docs/clients.md", "Reading the producer id", 0): not_run("a log line, not code"),
    ("docs/benchmarks.md", "Running them", 0): not_run(
        "benchmark runs of minutes each (every row about 15 minutes); each row runs in the"
        " suite's short mode in tests/ops/test_bench.py::"
        "test_suite_short_mode_reports_every_ratio_row"
    ),
    ("docs/kafka-conformance.md", "How it is checked", 0): not_run(
        "it re-records the golden files in the checkout, with a Kafka node of its own; the"
        " same replay against Kafka runs in tests/ops/testing/test_conformance_live.py::"
        "test_kafka_answers_as_recorded, and the command's arguments in"
        " tests/ops/testing/test_conformance.py::test_record_refuses_unknown_cases"
    ),
    ("docs/spark-deployment.md", "(a) Recommended: install the wheel on every machine", 0): (
        run_by(
            "tests/ops/spark/test_cluster.py::packages (as (b)'s first command, in a copy of"
            " the checkout)"
        )
    ),
    ("docs/spark-deployment.md", "(a) Recommended: install the wheel on every machine", 1): (
        not_run(
            "it installs into /opt and downloads; the test installs the same wheel with"
            " --no-deps --no-index into a temporary venv, as the page says"
        )
    ),
    ("docs/spark-deployment.md", "(a) Recommended: install the wheel on every machine", 2): (
        run_by(
            "tests/ops/spark/test_cluster.py::"
            "test_installed_wheel_writes_every_row_once_to_postgresql"
        )
    ),
    ("docs/spark-deployment.md", "(b) Ship pidctl with the job: `--py-files`", 0): run_by(
        "tests/ops/spark/test_cluster.py::packages (the build, in a copy of the checkout) and"
        " tests/ops/spark/test_cluster.py::test_py_files_zip_writes_every_row_once (the"
        " spark-submit, against the test's master, pidctl and database)"
    ),
    ("docs/spark-deployment.md", "What happens without either: `ModuleNotFoundError`", 0): (
        not_run(
            "a log excerpt, reproduced by tests/ops/spark/test_cluster.py::"
            "test_executors_without_pidctl_fail_naming_it"
        )
    ),
    ("docs/spark-deployment.md", "Try it: a standalone cluster on one machine", 0): run_by(
        "ops/testing/spark_cluster.py (the same spark-class commands on free ports) in"
        " tests/ops/spark/test_cluster.py"
    ),
    ("docs/spark-deployment.md", "Try it: a standalone cluster on one machine", 1): not_run(
        "it is a part of this suite"
    ),
    ("docs/spark-kafka.md", "PID ranges: the job's apart from the cluster's", 0): run_by(
        "tests/test_docs.py::test_configuration_fragments_load"
    ),
    ("docs/spark-kafka.md", "Using it", 0): run_by(
        "tests/ops/spark/test_kafka_examples.py::test_example_runs_and_writes_every_row_once"
        " (in the test session's SparkSession)"
    ),
    ("docs/spark-kafka.md", "Using it", 1): run_by(
        "tests/ops/spark/test_kafka_examples.py::test_example_runs_and_writes_every_row_once"
        " (after the block before it, as the page reads)"
    ),
    ("docs/spark-kafka.md", "Using it", 2): not_run(
        "a spark-submit of the reader's job; the carrier's jar is built by the same command and"
        " put on the class path in tests/ops/spark/conftest.py::spark and in the cluster"
        " benchmark (ops/bench/spark_kafka.py)"
    ),
    ("docs/spark-kafka.md", "What a write does", 0): not_run(
        "a log line; the job of tests/ops/spark/test_kafka_on_cluster.py::"
        "test_every_row_once_when_an_executor_dies_and_the_verifier_says_so writes one"
    ),
    ("docs/spark-kafka.md", "Verifying a version: `pidctl kafka verify`", 0): not_run(
        "it names a broker and topic of the reader's; the command runs against the test's in"
        " tests/ops/spark/test_kafka_verify.py::"
        "test_a_written_version_is_confirmed_and_a_copied_row_is_found"
    ),
    ("docs/spark-sink.md", 'The exactly-once SQL sink (`write_sql`, `format("pidctl-sql")`)', 0): (
        run_by("tests/ops/spark/test_write.py::test_the_documented_write_runs_as_written")
    ),
    ("docs/spark-sink.md", "Producer ids for a whole job, fetched once by the driver", 0): run_by(
        "tests/ops/spark/test_readme_examples.py::test_the_examples_run_as_written"
    ),
    ("docs/spark-sink.md", "The table's columns, checked on the driver", 0): not_run(
        "an error message, reproduced by tests/ops/spark/test_sink_cluster.py::"
        "test_schema_problems_are_named_before_any_task"
    ),
    ("docs/spark-sink.md", "Idempotent re-runs: `txnAppId` and `txnVersion`", 0): run_by(
        "tests/ops/spark/test_readme_examples.py::test_the_examples_run_as_written"
    ),
    ("docs/spark-sink.md", "Idempotent re-runs: `txnAppId` and `txnVersion`", 1): not_run(
        "an error message, reproduced by tests/ops/spark/test_sink_cluster.py::"
        "test_a_lower_version_losing_a_race_fails_naming_the_winner"
    ),
    ("docs/spark-sink.md", "Structured Streaming", 0): run_by(
        "tests/ops/spark/test_stream.py::test_the_streaming_example_runs_as_written"
    ),
    ("docs/spark-sink.md", "The metadata log as a DataFrame", 0): run_by(
        "tests/ops/spark/test_readme_examples.py::test_the_examples_run_as_written"
    ),
    ("docs/spark-sink.md", "Against Spark's own JDBC sink", 0): not_run(
        "benchmark runs of minutes each on a two-worker cluster; the same job, small, runs in"
        " tests/ops/spark/test_sink_cluster.py::test_the_benchmark_against_spark_jdbc_runs"
    ),
}


def test_every_block_is_run_or_says_why_not() -> None:
    found = {b.key: b for document in docs.DOCUMENTS for b in docs.blocks(document)}
    unlisted = sorted(set(found) - set(BLOCKS))
    assert not unlisted, (
        "blocks no test runs and BLOCKS in tests/test_docs.py does not list (run each as"
        f" written in a test, or say why not): {unlisted}"
    )
    assert sorted(set(BLOCKS) - set(found)) == [], "BLOCKS lists blocks that are gone"
    for how in BLOCKS.values():
        for test in re.findall(r"(tests/\S+\.py)::(\w+)", how):
            path, name = ROOT / test[0], test[1]
            assert re.search(rf"^(async )?def {name}\(", path.read_text(), re.M), test


def test_log_format_lists_every_record_type() -> None:
    """docs/log-format.md's table of record types: each type id, name and field."""
    text = (ROOT / "docs" / "log-format.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| (.*) \|$", text, re.M)
    documented = {int(number): (name, fields) for number, name, fields in rows}
    assert set(documented) == set(RECORD_TYPES)
    for number, cls in RECORD_TYPES.items():
        name, fields = documented[number]
        assert name == cls.__name__
        for field in dataclasses.fields(cls):
            assert f"`{field.name}`" in fields, (name, field.name)


def _shell(
    command: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={**os.environ, **(env or {}), "PATH": f"{VENV_BIN}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def dev_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """`ops/dev.sh serve` as the Quick start has it running, in a checkout-like folder
    (``.venv`` there), on ports the kernel picks as it binds them (so no other process can
    take one first and answer in its place): (bootstrap, metrics address), from its log
    (serve.log, kept with a failed test's folder)."""
    (tmp_path / ".venv").symlink_to(VENV_BIN.parent)
    log = tmp_path / "serve.log"
    ports = ["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [str(ROOT / "ops" / "dev.sh"), "serve", *ports],
            cwd=tmp_path,
            env={**os.environ, "VENV": str(VENV_BIN.parent)},
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    events: dict[str, dict[str, Any]] = {}

    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"ops/dev.sh serve exited with {proc.returncode}: {log.read_text()}")
        for line in log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                events[event["event"]] = event
        return "listening" in events

    try:
        wait_until(listening, "the dev server listening", timeout=120)
        port, metrics = events["listening"]["ports"][0], events["metrics listening"]["port"]
        yield f"127.0.0.1:{port}", f"127.0.0.1:{metrics}"
    finally:
        proc.terminate()
        proc.wait(30)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_quick_start_as_written(dev_server: tuple[str, str], tmp_path: Path) -> None:
    """Each command of the Quick start, in order, from the checkout's top folder (here a
    folder with its .venv), against `ops/dev.sh serve`; every output the block shows in a
    comment below a command is what that command prints. Then the kafka-python example, twice:
    the second producer has the same PID, one epoch higher."""
    bootstrap, metrics = dev_server
    ports = {"127.0.0.1:9093": bootstrap, "127.0.0.1:9464": metrics}
    moved = docs.moved(docs.block("README.md", "Quick start", 0), ports)
    lines = moved.replace("\\\n", " ").splitlines()
    for at, line in enumerate(lines):
        if not line.strip() or line.startswith("#"):
            continue
        done = _shell(line.split("  #")[0], tmp_path)
        assert done.returncode == 0, (line, done.stderr)
        said = lines[at + 1] if at + 1 < len(lines) else ""
        if said.startswith("# "):
            assert done.stdout.strip() == said[2:], line
        elif "log dump" in line:
            assert "ProducerIdsGranted" in done.stdout
        elif "status" in line:  # the test's server answered, not another on the machine
            cluster = stored_cluster_id(tmp_path / "pidctl-data")
            assert f"cluster id:  {cluster}" in done.stdout and "broker 1" in done.stdout
        elif "curl" in line:
            assert done.stdout.strip() == "pidctl_next_producer_id 1000.0"
    example = docs.moved(docs.block("README.md", "Quick start", 1), ports)
    (tmp_path / "producer.py").write_text(example)
    printed = re.search(r"\)  # (.*)\n", example)
    assert printed is not None
    first = _shell(".venv/bin/python producer.py", tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.strip() == printed.group(1)
    again = _shell(".venv/bin/python producer.py", tmp_path)
    assert again.stdout.strip() == printed.group(1).replace("epoch=0", "epoch=1")
    # docs/getting-started.md's audit trail, on the data dir the quick start made (the
    # report: Spark SQL over the log, with one broker's grant and the pool's).
    trail = docs.commands(docs.block("docs/getting-started.md", "The audit trail", 0))
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYSPARK")}
    env["PYSPARK_SUBMIT_ARGS"] = "--conf spark.ui.enabled=false pyspark-shell"
    outputs: list[str] = []
    for line in trail:
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=tmp_path,
            env={**env, "PATH": f"{VENV_BIN}:{env['PATH']}"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (line, done.stderr[-3000:])
        outputs.append(done.stdout)
    summary, verified, report = outputs
    assert re.search(r"broker 1\b.*1 block", summary), summary
    assert "ok" in verified.lower(), verified
    assert "# When does the range run out?" in report and "NULL" in report, report


def test_the_security_configuration_as_written(tmp_path: Path) -> None:
    """docs/security.md's production configuration, with its files made here (a CA, the server's
    certificate, a user) and its listeners on free ports: the server starts on both, and
    `config show` of it loads back as the same settings."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {
        "/etc/pidctl/server.pem": tmp_path / "server.pem",
        "/etc/pidctl/server.key": tmp_path / "server.key",
        "/etc/pidctl/ca.pem": tmp_path / "ca.pem",
        "/etc/pidctl/users.json": tmp_path / "users.json",
    }
    cert.cert_chain_pems[0].write_to_path(str(files["/etc/pidctl/server.pem"]))
    cert.private_key_pem.write_to_path(str(files["/etc/pidctl/server.key"]))
    ca.cert_pem.write_to_path(str(files["/etc/pidctl/ca.pem"]))
    add_sasl_user(files["/etc/pidctl/users.json"], "admin", "admin-secret")
    text = docs.block("docs/security.md", "Security", 0)
    for written, made in files.items():
        text = text.replace(written, str(made))
    sasl_ssl, ssl = free_port(), free_port()
    text = text.replace("0.0.0.0:9094", f"127.0.0.1:{sasl_ssl}")
    text = text.replace("0.0.0.0:9095", f"127.0.0.1:{ssl}")
    text = text.replace("pidctl-1.example.com:9094", f"pidctl-1.example.com:{sasl_ssl}")
    assert "/etc/pidctl" not in text and "0.0.0.0" not in text
    config = tmp_path / "pidctl.toml"
    config.write_text(text)
    with ServerProcess(tmp_path / "d", "--config", str(config)) as server:
        assert server.event("listening")["listeners"] == [  # as advertised
            f"SASL_SSL://pidctl-1.example.com:{sasl_ssl}",
            f"SSL://127.0.0.1:{ssl}",
        ]
    shown = subprocess.run(
        [sys.executable, "-m", "pidctl.controller.cli", "config", "show", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    again = tmp_path / "shown.toml"
    again.write_text(shown.stdout)
    reshown = subprocess.run(
        [sys.executable, "-m", "pidctl.controller.cli", "config", "show", "--config", str(again)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reshown.returncode == 0, reshown.stderr
    strip = re.compile(r"  # .*$|^# .*$", re.M)
    shown_again = tomllib.loads(strip.sub("", reshown.stdout))
    assert shown_again == tomllib.loads(strip.sub("", shown.stdout))


def test_configuration_fragments_load(tmp_path: Path) -> None:
    """docs/spark-kafka.md's configuration fragment is a valid pidctl configuration."""
    config = tmp_path / "pidctl.toml"
    config.write_text(
        docs.block("docs/spark-kafka.md", "PID ranges: the job's apart from the cluster's", 0)
    )
    shown = subprocess.run(
        [sys.executable, "-m", "pidctl.controller.cli", "config", "show", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"first_producer_id = {2**62}  # {config}: first_producer_id" in shown.stdout


def test_the_broker_side_example_as_written(tmp_path: Path) -> None:
    example = docs.block("docs/broker-library.md", "The broker library (`pidctl.broker`)", 0)
    (tmp_path / "example.py").write_text(example)
    (tmp_path / ".venv").symlink_to(VENV_BIN.parent)
    done = _shell(".venv/bin/python example.py", tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "500 509\n"  # the comment's offsets: the duplicate's original ones


def _block_of(zookeeper: ZooKeeperProcess, start: int, end: int) -> None:
    """ZooKeeper's /latest_producer_id_block as a Kafka cluster on ZooKeeper left it."""
    client = KazooClient(hosts=zookeeper.hosts)
    client.start(timeout=30)
    block = {"version": 1, "broker": 2, "block_start": str(start), "block_end": str(end)}
    client.ensure_path("/latest_producer_id_block")
    client.set("/latest_producer_id_block", json.dumps(block).encode())
    client.stop()
    client.close()


def test_the_fleet_and_the_import_as_written(etcd: EtcdProcess, tmp_path: Path) -> None:
    """The fleet's commands with etcd, ports and the ZooKeeper host moved to the test's: two
    controllers share one PID space through etcd leases; then both import commands raise
    the marks above ZooKeeper's last block."""
    moves = {
        "127.0.0.1:2379": etcd.endpoint,
        "127.0.0.1:9093": f"127.0.0.1:{free_port()}",
        "127.0.0.1:9094": f"127.0.0.1:{free_port()}",
        "127.0.0.1:9464": f"127.0.0.1:{free_port()}",
        "127.0.0.1:9465": f"127.0.0.1:{free_port()}",
    }

    def moved(text: str) -> str:
        return docs.moved(text, moves)

    fleet = docs.commands(moved(docs.block("docs/fleets.md", "Running a fleet", 0)))
    formats, serves = fleet[0], fleet[1:]
    assert _shell(formats, tmp_path).returncode == 0
    # One cluster: a broker moving between the controllers keeps its cluster id.
    assert stored_cluster_id(tmp_path / "c1") == stored_cluster_id(tmp_path / "c2")
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    servers = [
        subprocess.Popen(
            shlex.split(line),
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for line in serves
    ]
    firsts = []
    try:
        for line in serves:
            bootstrap = re.search(r"--listen (\S+)", line)
            assert bootstrap is not None
            port = int(bootstrap.group(1).rsplit(":", 1)[1])
            wait_until(functools.partial(_listening, port), "a controller of the fleet")
            with SyncClient(bootstrap.group(1)) as client:
                granted = client.request(requests.allocate(-1, -1))
            assert granted.error_code == 0
            firsts.append(int(granted.producer_id_start))
    finally:
        for server in servers:
            server.terminate()
            server.wait(30)
    # Each took a lease of its own from the shared counter: their first blocks are a lease
    # (1,000,000 PIDs by default) apart, never the same.
    assert abs(firsts[0] - firsts[1]) >= 1_000_000
    with ZooKeeperProcess(tmp_path / "zk") as zookeeper:
        _block_of(zookeeper, 9_000_000, 9_000_999)
        moves["zk-1:2181"] = zookeeper.hosts
        imports = docs.commands(
            moved(docs.block("docs/fleets.md", "Migrating from ZooKeeper (KIP-730)", 0))
        )
        for line in imports:
            done = _shell(line, tmp_path)
            assert done.returncode == 0, (line, done.stderr)
            assert "raised from" in done.stdout or "nothing to do" in done.stdout, done.stdout
    counter = etcd.counter()
    assert counter is not None and counter >= 9_001_000


def test_the_app_id_acl_as_written() -> None:
    """docs/job-allocations.md's ACL: the etl team's principal may name its app ids only."""
    acls = [
        parse_acl(entry)
        for entry in tomllib.loads(docs.block("docs/job-allocations.md", "Owners and ACLs", 0))[
            "acls"
        ]
    ]
    authorizer = Authorizer(acls, enabled=True)
    assert authorizer.authorize("User:etl", "Write", "AppId", "etl-orders")
    assert not authorizer.authorize("User:etl", "Write", "AppId", "orders")
    assert not authorizer.authorize("User:other", "Write", "AppId", "etl-orders")


def test_the_reloadable_acls_as_written(tmp_path: Path) -> None:
    """docs/quotas-and-reloads.md's ACLs as one array: a reload takes the file, and the file
    cut after any of its lines is no longer one it takes (it does not parse)."""
    text = docs.block("docs/quotas-and-reloads.md", "Reloads (SIGHUP)", 0)
    config = tmp_path / "pidctl.toml"
    config.write_text(text)
    settings, _ = load_settings_with_sources({}, {}, config, for_reload=True)
    authorizer = Authorizer(settings.acls, enabled=settings.authorizer == "acl")
    assert authorizer.authorize("User:etl", "Write", "TransactionalId", "etl-orders")
    assert not authorizer.authorize("User:etl", "Write", "TransactionalId", "orders")
    lines = text.splitlines(keepends=True)
    for cut in range(lines.index("acls = [\n") + 1, len(lines)):
        config.write_text("".join(lines[:cut]))
        with pytest.raises(SettingsError):
            load_settings_with_sources({}, {}, config, for_reload=True)


def _is_commit(word: str) -> bool:
    """Whether ``word`` names a commit of this repository (when it is a git checkout)."""
    found = subprocess.run(
        ["git", "rev-parse", "--quiet", "--verify", f"{word}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
    )
    return found.returncode == 0


def test_user_documents_carry_no_working_notes() -> None:
    """No commit hash, issue number, working session's word or run's date in the README,
    docs/, the changelog or CONTRIBUTING.md: the history is git's."""
    found = {
        document: notes
        for document in docs.USER_DOCUMENTS
        if (notes := docs.working_notes((ROOT / document).read_text(), _is_commit))
    }
    assert found == {}


def test_working_notes_are_recognised() -> None:
    """The check above can fail: each kind it looks for, and what it leaves alone."""
    head = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    for note in (
        "at 1212607 and e73ee6f",
        "issue 34's goals",
        "issues 17 and 34",
        "see #12",
        "this session",
        "an eleventh session",
        "in a slow hour",
        "this round",
        "while other helpers ran their suites",
        "2026-11-27, the suite alone",
        *([f"built at {head}"] if head else []),
    ):
        assert docs.working_notes(note, _is_commit), note
    for fine in (
        "KIP-730",
        "KAFKA-12207",
        "a broker's session timeout",
        "SparkSession",
        "--since 2026-11-01T00:00:00Z",
        "TEXT (`'2024-02-29'`)",
        "cluster id c0ffee",
        "first_producer_id = 4611686018427387904",
        "[the list](#what-pidctl-answers-api-by-api)",
        "## [1.0.0] - 2026-12-05",
    ):
        assert docs.working_notes(fine, lambda word: False) == [], fine


def test_the_configuration_reference_is_generated_from_the_settings() -> None:
    """docs/configuration.md's table is what `python -m ops.configuration_doc` writes from
    Settings: a setting added, removed or redocumented without it fails here."""
    page = configuration_doc.PAGE.read_text()
    assert configuration_doc.generated(page) == page, (
        "docs/configuration.md is stale: run python -m ops.configuration_doc"
    )
    for name in SETTING_NAMES:
        assert f"| `{name}` |" in page


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_pidctl_command_named_parses() -> None:
    """Every `pidctl ...` in a code span or a shell block of the README and docs/ names a
    command that exists, and only flags that command has."""
    problems = []
    for document in docs.DOCUMENTS:
        for words, flags in docs.pidctl_commands(document):
            parser, named = build_parser(), ["pidctl"]
            for word in words:
                commands = _subcommands(parser)
                if not commands:
                    break
                if word not in commands:
                    problems.append(f"{document}: {' '.join(named)} has no command {word!r}")
                    break
                parser = commands[word]
                named.append(word)
            options = {o for action in parser._actions for o in action.option_strings}
            problems += [
                f"{document}: {' '.join(named)} has no {flag}"
                for flag in flags
                if flag not in options
            ]
    assert problems == []


def test_run_as_written(tmp_path: Path) -> None:
    """The README's `format` and `serve`, the data dir in the test's folder and the ports
    free ones: it formats (its parents made), serves on the wildcard address, and tells
    clients the advertised address, not its own."""
    port, metrics = free_port(), free_port()
    moves = {
        "/var/lib/pidctl": str(tmp_path / "var" / "lib" / "pidctl"),
        "0.0.0.0:9093": f"0.0.0.0:{port}",
        "pidctl-1.example.com:9093": f"pidctl-1.example.com:{port}",
        "0.0.0.0:9464": f"127.0.0.1:{metrics}",
    }
    formats, serves = docs.commands(docs.moved(docs.block("README.md", "Run", 0), moves))
    done = _shell(formats, tmp_path)
    assert done.returncode == 0, done.stderr
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"}
    server = subprocess.Popen(
        shlex.split(serves), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until(functools.partial(_listening, port), "the README's server")
        with SyncClient(f"127.0.0.1:{port}") as client:
            [node] = client.request(requests.metadata([])).brokers
        assert (node.host, node.port) == ("pidctl-1.example.com", port)
    finally:
        server.terminate()
        assert server.wait(30) == 0
    # The same serve without the advertised address is refused, saying why.
    bare = re.sub(r"--advertised-listener \S+ ", "", serves)
    refused = _shell(bare, tmp_path)
    assert refused.returncode == 2 and "advertised_listener: required" in refused.stderr


def test_config_show_as_written(tmp_path: Path) -> None:
    """docs/configuration.md's `config show` on a file of the page's own example."""
    (tmp_path / "pidctl.toml").write_text("max_frame_bytes = 65536\n")
    [line] = docs.commands(docs.block("docs/configuration.md", "Configuration", 0))
    shown = _shell(line, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "max_frame_bytes = 65536  # pidctl.toml: max_frame_bytes" in shown.stdout
    assert 'listen = "127.0.0.1:9093"  # default' in shown.stdout


def test_every_relative_link_resolves() -> None:
    """A link of the user documents to a file of the checkout names one that exists."""
    broken = []
    for document in (*docs.USER_DOCUMENTS, "ARCHITECTURE.md"):
        page = ROOT / document
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#")[0]
            if path and "://" not in path and not (page.parent / path).exists():
                broken.append(f"{document}: {target}")
    # Pages named in the text (and in the code's comments) too.
    for path in [*docs.USER_DOCUMENTS, "ARCHITECTURE.md", *_sources()]:
        for named in re.findall(r"(?<![\w/.-])docs/[\w.-]+\.md", (ROOT / path).read_text()):
            if not (ROOT / named).exists():
                broken.append(f"{path}: {named}")
    assert broken == []


def _sources() -> list[str]:
    """The checkout's Python files and deployment assets, relative to it."""
    folders = ("controller", "protocol", "ops", "tests")
    return [
        str(path.relative_to(ROOT))
        for folder in folders
        for path in (ROOT / folder).rglob("*")
        if path.suffix in (".py", ".yaml", ".yml", ".sh") and "__pycache__" not in path.parts
    ] + ["Dockerfile", "pyproject.toml", "setup.py"]


def test_every_benchmark_row_named_exists() -> None:
    """Every `python -m ops.bench.suite ... --only ROWS` in the README and docs/ (the
    headline figures' commands among them) names rows the suite has."""
    from ops.bench import suite

    named = [
        (document, match.group(1))
        for document in docs.DOCUMENTS
        for match in re.finditer(
            r"ops\.bench\.suite\b[^`\n|]*?--only[ =]([\w,.-]+)", (ROOT / document).read_text()
        )
    ]
    assert any(document == "README.md" for document, _ in named)
    for document, rows in named:
        try:
            suite._only(rows)
        except argparse.ArgumentTypeError as e:
            raise AssertionError(f"{document}: {e}") from None
