"""The golden files are Kafka's answers still: the corpus replayed against a live Kafka (the
test process's shared node) gives what they record. CI has Kafka (ops/dev.sh fetches it):
nothing here is skipped without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops.testing.conformance.corpus import CASES, Case
from ops.testing.conformance.differences import differences
from ops.testing.conformance.error_classes import ask_the_client, read_classes
from ops.testing.conformance.golden import RECORD_COMMAND, read_golden
from ops.testing.conformance.replay import replay
from ops.testing.conformance.targets import kafka_node, kafka_target, warm_up
from ops.testing.kafka import KafkaNode

#: The one case that takes long against Kafka (32,765 re-inits, ~30 s quiet): its own test.
EXHAUSTION = "init-epoch-exhaustion"


def _check(kafka: KafkaNode, cases: list[Case]) -> None:
    warm_up(kafka)
    found = []
    for case in cases:
        steps = replay(case, kafka_target(kafka, case.profile), from_source=True)
        found += differences(case.name, read_golden(case)["steps"], steps)
    assert not found, f"Kafka no longer answers as recorded ({RECORD_COMMAND}):\n" + "\n".join(
        map(str, found)
    )


def test_kafka_answers_as_recorded(kafka: KafkaNode) -> None:
    _check(
        kafka,
        [
            case
            for case in CASES
            if case.recordable and case.name != EXHAUSTION and not case.fresh_node
        ],
    )


@pytest.mark.slow
def test_a_fresh_kafka_answers_as_recorded() -> None:
    # A node of its own per case, not warmed up: what Kafka answers before its internal
    # topics exist (the shared node's have long been created).
    for case in CASES:
        if case.fresh_node:
            with kafka_node() as node:
                found = differences(
                    case.name,
                    read_golden(case)["steps"],
                    replay(case, kafka_target(node, case.profile), from_source=True),
                )
            assert not found, f"Kafka no longer answers as recorded ({RECORD_COMMAND}):\n" + (
                "\n".join(map(str, found))
            )


@pytest.mark.slow
def test_kafka_exhausts_epochs_as_recorded(kafka: KafkaNode) -> None:
    _check(kafka, [case for case in CASES if case.name == EXHAUSTION])


def test_the_java_client_still_classes_errors_as_recorded(tmp_path: Path) -> None:
    # KIP-1050's classes, as Kafka's Java client (the jar set's) gives them now.
    assert ask_the_client(read_classes(), tmp_path) == read_classes(), (
        "re-record: python -m ops.testing.conformance classes"
    )
