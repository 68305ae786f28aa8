"""Real Kafka producers bootstrapping against the real server: confluent-kafka (librdkafka)
and kafka-python, idempotent and transactional."""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import confluent_kafka
import kafka
import pytest
from kafka.errors import ProducerFencedError

from ops.testing.serverproc import ServerProcess
from pidctl.client import SyncClient
from pidctl.protocol import requests
from tests import wire

_ACQUIRED = re.compile(r"Acquired PID\{Id:(\d+),Epoch:(\d+)\}")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def librdkafka_pid(bootstrap: str, **config: object) -> tuple[int, int]:
    """Start a confluent-kafka producer and return the (PID, epoch) librdkafka acquired, read
    from its own 'eos' debug log (the library has no API for it)."""
    handler = _Lines()
    logger = logging.getLogger(f"librdkafka-{id(handler)}")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    logger.propagate = False
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "debug": "eos", "logger": logger, **config}
    )
    if "transactional.id" in config:
        producer.init_transactions(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        producer.poll(0.05)
        for line in handler.lines:
            if match := _ACQUIRED.search(line):
                return int(match[1]), int(match[2])
    raise AssertionError("librdkafka acquired no PID: " + "\n".join(handler.lines[-10:]))


def kafka_python_producer(bootstrap: str, **config: object) -> kafka.KafkaProducer:
    return kafka.KafkaProducer(bootstrap_servers=bootstrap, **config)


def kafka_python_pid(producer: kafka.KafkaProducer) -> tuple[int, int]:
    manager = producer._transaction_manager
    deadline = time.monotonic() + 30
    while not manager.has_producer_id():
        assert time.monotonic() < deadline, "kafka-python acquired no PID"
        time.sleep(0.02)
    pid = manager.producer_id_and_epoch
    return pid.producer_id, pid.epoch


def test_librdkafka_idempotent_producers(server: ServerProcess) -> None:
    a = librdkafka_pid(server.bootstrap, **{"enable.idempotence": True})
    b = librdkafka_pid(server.bootstrap, **{"enable.idempotence": True})
    assert a[1] == b[1] == 0 and a[0] != b[0]


def test_librdkafka_transactional_producers_bump_the_epoch(server: ServerProcess) -> None:
    first = librdkafka_pid(server.bootstrap, **{"transactional.id": "orders-tx"})
    second = librdkafka_pid(server.bootstrap, **{"transactional.id": "orders-tx"})
    assert first == (first[0], 0)
    assert second == (first[0], 1)
    # The first producer's epoch is now fenced: a KIP-360 init with it is refused.
    with SyncClient(server.bootstrap) as client:
        fenced = client.request(
            requests.init_producer_id("orders-tx", producer_id=first[0], producer_epoch=0)
        )
    assert fenced.error_code == confluent_kafka.KafkaError.PRODUCER_FENCED


def test_kafka_python_idempotent_producer(server: ServerProcess) -> None:
    producer = kafka_python_producer(server.bootstrap, enable_idempotence=True)
    try:
        pid, epoch = kafka_python_pid(producer)
    finally:
        producer.close(1)
    assert pid >= 0 and epoch == 0


def test_kafka_python_transactional_fencing(server: ServerProcess) -> None:
    # kafka-python guesses a broker's version from APIs pidctl does not serve (Fetch, Produce)
    # and would take it for Kafka 1.0, which has no KIP-360; its api_version setting says 2.5.
    first = kafka_python_producer(
        server.bootstrap, transactional_id="payments-tx", api_version=(2, 5)
    )
    second = kafka_python_producer(server.bootstrap, transactional_id="payments-tx")
    try:
        first.init_transactions()
        pid, epoch = kafka_python_pid(first)
        second.init_transactions()
        assert kafka_python_pid(second) == (pid, epoch + 1)
        # The first producer next talks to the controller (a KIP-360 epoch bump carrying its
        # old pair, what kafka-python does after a recoverable error): it is fenced.
        manager = first._transaction_manager
        manager.bump_producer_id_and_epoch()  # normally called on the sender thread, so
        first._sender.wakeup()  # wake that thread to send the enqueued request now
        deadline = time.monotonic() + 30
        while not manager.has_fatal_error():
            assert time.monotonic() < deadline, "the first producer was never fenced"
            time.sleep(0.02)
        assert isinstance(manager.last_error, ProducerFencedError)
        with pytest.raises(kafka.errors.KafkaError):
            first.begin_transaction()
    finally:
        first.close(1)
        second.close(1)


def test_client_pids_never_collide_with_broker_blocks_across_restarts(tmp_path: Path) -> None:
    pids: list[int] = []
    blocks: list[tuple[int, int]] = []
    with ServerProcess(tmp_path / "d") as server:
        with SyncClient(server.bootstrap) as client:
            epoch = wire.register(client, 1, server.cluster_id())
        for _ in range(3):
            with SyncClient(server.bootstrap) as client:
                grant = client.request(wire.allocate(1, epoch))
                blocks.append((grant.producer_id_start, grant.producer_id_len))
            pids.append(librdkafka_pid(server.bootstrap, **{"enable.idempotence": True})[0])
            producer = kafka_python_producer(server.bootstrap, enable_idempotence=True)
            pids.append(kafka_python_pid(producer)[0])
            producer.close(1)
            with SyncClient(server.bootstrap) as client:
                grant = client.request(wire.allocate(1, epoch))
                blocks.append((grant.producer_id_start, grant.producer_id_len))
            server.kill()
            server.start()
    wire.assert_pids_outside_blocks(pids, blocks)
