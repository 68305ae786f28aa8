"""Kafka's own Java client (kafka-clients 4.4) against pidctl, and against Kafka itself as the
reference, in the same test: ProducerProbe (ops/testing/java/) run by javac and java.

What a user sees is read where a user would read it: the producer id and epoch from the
client's log line ``ProducerId set to P with epoch E``; the program also reports the pair
held by the producer's TransactionManager, which must agree, and which transaction protocol
the client chose from the server's ApiVersions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.testing.java_client import ProbeRun, compile_probe, run_probe
from ops.testing.kafka import KafkaNode
from ops.testing.serverproc import ServerProcess, wait_until
from pidctl.client import SyncClient
from pidctl.protocol import requests

FENCED = "org.apache.kafka.common.errors.ProducerFencedException"
UNSUPPORTED = "org.apache.kafka.common.errors.UnsupportedVersionException"
TIMEOUT = "org.apache.kafka.common.errors.TimeoutException"


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """ProducerProbe compiled once for this module's tests."""
    yield compile_probe(tmp_path_factory.mktemp("java-probe"))


def run_against_both(
    probe: Path, server: ServerProcess, kafka: KafkaNode, command: str, name: str
) -> dict[str, ProbeRun]:
    """ProducerProbe ``command`` against Kafka (the reference) and against pidctl."""
    return {
        "kafka": run_probe(probe, command, kafka.bootstrap, name),
        "pidctl": run_probe(probe, command, server.bootstrap, name),
    }


def controller_blocks(server: ServerProcess) -> list[tuple[int, int]]:
    """The blocks pidctl granted to its own InitProducerId pool, from its audit lines."""
    return [
        (event["first_producer_id"], event["last_producer_id"])
        for event in server.events
        if event.get("event") == "producer ids granted" and event["holder"] == "controller"
    ]


def test_an_idempotent_producer_gets_its_producer_id(
    probe: Path, server: ServerProcess, kafka: KafkaNode
) -> None:
    topic = f"probe-output-{uuid.uuid4().hex[:8]}"
    runs = run_against_both(probe, server, kafka, "idempotent", topic)
    for name, run in runs.items():
        got = run.event("producer-id", "probe-idempotent")
        # The client's own log line says what its TransactionManager holds.
        assert run.producer_ids("probe-idempotent") == [(got["producer_id"], 0)], name
        assert got["producer_id"] >= 0 and got["epoch"] == 0, name

    # pidctl's answer is a PID of a block its log granted to its own pool.
    pid = runs["pidctl"].event("producer-id", "probe-idempotent")["producer_id"]
    wait_until(lambda: bool(controller_blocks(server)), "the pool's grant in the audit trail")
    assert any(first <= pid <= last for first, last in controller_blocks(server))

    # Kafka creates the topic and takes the record; pidctl hosts no topic, so send() waits
    # for the topic's metadata until max.block.ms, as against a cluster without the topic.
    assert runs["kafka"].event("sent", "probe-send")["offset"] == 0
    refused = runs["pidctl"].event("failed", "probe-send")
    assert (refused["call"], refused["exception"]) == ("send", TIMEOUT)
    assert refused["message"] == f"Topic {topic} not present in metadata after 5000 ms."
    assert refused["cause"] == "org.apache.kafka.common.errors.UnknownTopicOrPartitionException"


def advertised_transaction_version(bootstrap: str) -> tuple[int, dict[str, int]]:
    """The finalized features epoch and levels a server's ApiVersions (v3) advertises."""
    with SyncClient(bootstrap) as client:
        answer = client.request(requests.api_versions())
    levels = {f.name: int(f.max_version_level) for f in answer.finalized_features}
    return int(answer.finalized_features_epoch), levels


def check_fencing_pair(run: ProbeRun, name: str) -> int:
    """initTransactions(): the first instance (pid, 0), the second with the same
    transactional id (pid, 1); the log lines and the TransactionManager agree."""
    first = run.event("initialized", "probe-first")
    second = run.event("initialized", "probe-second")
    pid = first["producer_id"]
    assert (first["epoch"], second["producer_id"], second["epoch"]) == (0, pid, 1), name
    assert run.producer_ids("probe-first") == [(pid, 0)], name
    assert run.producer_ids("probe-second")[0] == (pid, 1), name
    return int(pid)


def test_transactional_producers_are_fenced_and_the_client_takes_the_classic_protocol(
    probe: Path, server: ServerProcess, kafka: KafkaNode
) -> None:
    transactional_id = f"probe-tx-{uuid.uuid4().hex[:8]}"
    runs = run_against_both(probe, server, kafka, "transactional", transactional_id)
    pids = {name: check_fencing_pair(run, name) for name, run in runs.items()}
    assert min(pids.values()) >= 0

    # Which transaction protocol: Kafka 4.4 finalizes transaction.version 2, and the client
    # takes transactions v2; pidctl finalizes no feature, and the client keeps the classic
    # protocol (v1), whose InitProducerId pidctl serves.
    epoch, levels = advertised_transaction_version(kafka.bootstrap)
    assert epoch >= 0 and levels["transaction.version"] == 2
    assert advertised_transaction_version(server.bootstrap) == (-1, {})
    kafka_run, pidctl_run = runs["kafka"], runs["pidctl"]
    for client in ("probe-first", "probe-second"):
        assert kafka_run.event("initialized", client)["transaction_v2"] is True
        assert pidctl_run.event("initialized", client)["transaction_v2"] is False
    assert kafka_run.log_lines("probe-first", "Updating isTV2 enabled to true")
    assert not pidctl_run.log_lines("probe-first", "isTV2")
    assert kafka_run.log_lines("probe-first", "to transaction with transaction protocol V2")
    assert pidctl_run.log_lines("probe-first", "Begin adding offsets")
    assert not pidctl_run.log_lines("probe-first", "transaction protocol V2")

    # Kafka: the first instance's next transactional call finds it fenced; the second one
    # commits, and transactions v2 bumps its epoch at the commit (EndTxn v5).
    fenced = kafka_run.event("failed", "probe-first")
    assert (fenced["call"], fenced["exception"]) == ("sendOffsetsToTransaction", FENCED)
    committed = kafka_run.event("committed", "probe-second")
    assert (committed["producer_id"], committed["epoch"]) == (pids["kafka"], 2)
    assert kafka_run.producer_ids("probe-second") == [(pids["kafka"], 1), (pids["kafka"], 2)]

    # pidctl serves no transaction API but InitProducerId and does not list them in
    # ApiVersions: the client refuses the call itself, at once, with a clear exception, for
    # the fenced instance and the current one alike (neither waits out max.block.ms).
    for client in ("probe-first", "probe-second"):
        refused = pidctl_run.event("failed", client)
        assert (refused["call"], refused["exception"]) == ("sendOffsetsToTransaction", UNSUPPORTED)
        assert refused["message"] == "The node does not support ADD_OFFSETS_TO_TXN"
