from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from hypothesis import settings

from ops.testing.conformance.targets import kafka_node as conformance_kafka_node
from ops.testing.coordination import EtcdProcess
from ops.testing.kafka import QUICK_JVM_OPTIONS, KafkaNode
from ops.testing.serverproc import ServerProcess, without_hypothesis
from ops.testing.user_server import UserServerCheck

# Properties here are about records and bytes, not time: no per-example deadline, which
# only flakes on a busy 2-core CI machine.
settings.register_profile("pidctl", deadline=None)
settings.load_profile("pidctl")


@pytest.fixture(scope="session", autouse=True)
def session_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One temporary directory for everything this session's processes write there, removed
    at its end: Python's ``tempfile`` here and in every child (``TMPDIR``), and every JVM's
    ``java.io.tmpdir`` (Spark's block managers, scratch and artifact dirs, native libraries
    unpacked by each JVM), without the JVMs' hsperfdata files. Every Python started finds
    ops/testing/without_hypothesis first on its path. A process killed by a test
    (a crashed driver, a SIGKILLed broker) cannot clean after itself; this does. pytest's own
    ``tmp_path`` dirs are kept only for failed tests (``tmp_path_retention_policy``)."""
    tmp_path_factory.getbasetemp()  # pytest's own, chosen before TMPDIR changes
    directory = Path(tempfile.mkdtemp(prefix="pidctl-tests-"))
    directory.chmod(0o755)  # PostgreSQL's own user reaches its data dir in here
    saved = {name: os.environ.get(name) for name in ("TMPDIR", "JAVA_TOOL_OPTIONS", "PYTHONPATH")}
    # The tests' JVMs (Spark, Kafka, the Java client) live seconds to minutes: C1's quick
    # compiles and one GC thread cost a third less CPU than C2 and G1 on two cores, which the
    # suite's JVMs share (a benchmark's Kafka runs as shipped: KafkaNode(shipped_jvm=True)).
    java = " ".join([f"-Djava.io.tmpdir={directory}", "-XX:-UsePerfData", *QUICK_JVM_OPTIONS])
    os.environ["TMPDIR"] = str(directory)
    os.environ["JAVA_TOOL_OPTIONS"] = " ".join(filter(None, [saved["JAVA_TOOL_OPTIONS"], java]))
    # The processes started run without hypothesis, as installed (its stand-in says why).
    os.environ["PYTHONPATH"] = without_hypothesis(os.environ)["PYTHONPATH"]
    tempfile.tempdir = str(directory)
    try:
        yield directory
    finally:
        tempfile.tempdir = None
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A real `pidctl serve` on a loopback port with a fresh data dir."""
    with ServerProcess(tmp_path / "data") as proc:
        yield proc


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    """A real single-member etcd (Debian's etcd-server) on loopback ports."""
    with EtcdProcess(tmp_path / "etcd") as proc:
        yield proc


@pytest.fixture
def tls_etcd(tmp_path: Path) -> Iterator[tuple[EtcdProcess, Path]]:
    """etcd serving TLS only (a trustme certificate for 127.0.0.1), and its CA file."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = tmp_path / "c.pem", tmp_path / "k.pem", tmp_path / "ca.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    with EtcdProcess(tmp_path / "tls-etcd", tls=(cert_file, key_file)) as proc:
        yield proc, ca_file


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaNode]:
    """A real Apache Kafka node (broker and KRaft controller) shared by a test process's
    tests; tests that change its state use their own topics and ids. Set up as the
    conformance golden files were recorded: as shipped, plus SASL listeners for a user with
    no ACL (its PLAINTEXT listeners, the ones other tests use, are unrestricted)."""
    with conformance_kafka_node() as node:
        yield node


USER_SERVER = pytest.StashKey[UserServerCheck]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """The user's server beside the suite (ops/testing/user_server.py): once per run, in the
    controlling process (xdist's workers have ``workerinput``). ``TEST_USER_SERVER=start``
    plays the user's server when the default ports are free (on a machine of its own: CI);
    ``TEST_USER_SERVER=0`` skips the check, and the summary says so."""
    config = session.config
    mode = os.environ.get("TEST_USER_SERVER", "")
    if hasattr(config, "workerinput") or mode == "0":
        return
    if mode not in ("", "start"):
        raise pytest.UsageError(f"TEST_USER_SERVER={mode}: expected start or 0 (or unset)")
    check = UserServerCheck(play_user=mode == "start")
    config.stash[USER_SERVER] = check
    try:
        check.start()
    except Exception as e:  # the verdict says it; the tests still run
        check.failed = True
        check.verdict = f"FAILED: the user's server could not be started: {e}"


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    check = session.config.stash.get(USER_SERVER, None)
    if check is None:
        return
    check.finish()
    if check.failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    check = config.stash.get(USER_SERVER, None)
    terminalreporter.section("the user's server beside the suite")
    if check is None:
        terminalreporter.write_line("NOT CHECKED: TEST_USER_SERVER=0")
    else:
        terminalreporter.write_line(check.verdict, red=check.failed, green=not check.failed)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that take minutes first: under ``--dist loadscope`` (ops/dev.sh) a module
    is one unit of work on one worker, and a long one handed out last would run alone at the
    end. Spark's cluster and Kafka modules are the longest, then the other slow ones."""

    def weight(item: pytest.Item) -> int:
        if item.get_closest_marker("slow") is None:
            return 2
        return 0 if "/spark/" in item.nodeid else 1

    items.sort(key=weight)  # stable: collection order within each weight
