"""The Apache Kafka test bed: a real single-node KRaft cluster with its controller listener."""

from __future__ import annotations

import os
import socket

import pytest
from confluent_kafka import Producer

from ops.testing.kafka import KafkaNode, KafkaStartError
from pidctl.client import SyncClient
from pidctl.protocol import requests

ALLOCATE_PRODUCER_IDS, BROKER_REGISTRATION, INIT_PRODUCER_ID = 67, 62, 22


def test_broker_takes_an_idempotent_producer(kafka: KafkaNode) -> None:
    delivered: list[object] = []
    producer = Producer(
        {"bootstrap.servers": kafka.bootstrap, "enable.idempotence": True, "acks": "all"}
    )
    for value in range(5):
        producer.produce(
            "test-bed", str(value).encode(), on_delivery=lambda e, m: delivered.append(e)
        )
    assert producer.flush(120) == 0
    assert delivered == [None] * 5


def test_both_listeners_answer_as_kafka(kafka: KafkaNode) -> None:
    with SyncClient(kafka.bootstrap) as client:
        metadata = client.request(requests.metadata([]))
        broker_apis = {api.api_key for api in client.request(requests.api_versions()).api_keys}
    assert metadata.cluster_id == kafka.cluster_id
    assert [(b.node_id, b.port) for b in metadata.brokers] == [(1, kafka.port)]
    assert INIT_PRODUCER_ID in broker_apis
    with SyncClient(kafka.controller_bootstrap) as client:
        controller_apis = {api.api_key for api in client.request(requests.api_versions()).api_keys}
        # Broker 99 never registered: Kafka's controller calls its epoch stale.
        refused = client.request(requests.allocate(99, 0))
    assert {ALLOCATE_PRODUCER_IDS, BROKER_REGISTRATION} <= controller_apis
    assert (refused.error_code.value, refused.producer_id_start, refused.producer_id_len) == (
        77,
        0,
        0,
    )


def test_a_taken_port_is_named_before_any_jvm_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        node = KafkaNode(port=port)
        with pytest.raises(KafkaStartError, match=f"listener port {port} is taken"):
            node.start()
    assert node.process is None
    assert not node.directory.exists()


def test_a_failed_start_shows_the_log_and_leaves_nothing_behind() -> None:
    # Tiered storage switched on without a storage plugin: Kafka formats, starts and exits.
    node = KafkaNode({"remote.log.storage.system.enable": "true"})
    with pytest.raises(KafkaStartError) as failure:
        node.start()
    message = str(failure.value)
    assert "Kafka exited with 1 while starting" in message
    assert "Fatal error during broker startup" in message  # from its log's ERROR lines
    assert not node.directory.exists()


def test_stop_ends_the_jvm_and_removes_its_directory() -> None:
    node = KafkaNode().start()
    pid, directory = node.pid, node.directory
    node.stop()
    assert node.process is not None and node.process.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not directory.exists()
