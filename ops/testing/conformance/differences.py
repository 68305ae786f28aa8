"""Comparing pidctl's answers with Kafka's, field by field, and the differences pidctl keeps
deliberately (each explained in docs/kafka-conformance.md under its id).

A difference is one field path of one step's normalised answer (``api_keys.18``,
``coordinators.0.error_code``) where the two servers disagree, or where one has a field the
other has not. It is declared when a :class:`Deliberate` matches its case, step and path
(shell patterns) and, where the declaration names them, both values. A request that differs
from the golden file's means the corpus changed since the recording: re-record.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

Json = Any

#: A field one side has and the other has not.
ABSENT = "<absent>"


class _Any:
    def __repr__(self) -> str:
        return "ANY"


#: A declaration's value that matches anything.
ANY: Any = _Any()


@dataclass(frozen=True)
class Difference:
    """One field of one step where pidctl's answer is not Kafka's."""

    case: str
    step: str
    path: str
    kafka: Json
    pidctl: Json

    def __str__(self) -> str:
        where = f"{self.case} / {self.step} / {self.path}"
        return f"{where}: Kafka {self.kafka!r}, pidctl {self.pidctl!r}"


@dataclass(frozen=True)
class Deliberate:
    """A difference pidctl keeps on purpose; ``id`` names its entry in
    docs/kafka-conformance.md, ``reason`` says why in one line."""

    id: str
    reason: str
    #: Each a pattern, or several (any one matching).
    case: str | tuple[str, ...] = "*"
    step: str | tuple[str, ...] = "*"
    path: str | tuple[str, ...] = "*"
    kafka: Json = ANY
    pidctl: Json = ANY
    #: Whether the error codes differ in KIP-1050 class on purpose (error_classes.py): a
    #: client reacts otherwise, and the reason says why that is right.
    changes_class: bool = False

    def matches(self, difference: Difference) -> bool:
        """Whether this declaration covers ``difference``."""
        return (
            _matches(difference.case, self.case)
            and _matches(difference.step, self.step)
            and _matches(difference.path, self.path)
            and (self.kafka is ANY or self.kafka == difference.kafka)
            and (self.pidctl is ANY or self.pidctl == difference.pidctl)
        )


def _matches(text: str, patterns: str | tuple[str, ...]) -> bool:
    if isinstance(patterns, str):
        patterns = (patterns,)
    return any(fnmatchcase(text, pattern) for pattern in patterns)


def flatten(value: Json, prefix: str = "") -> dict[str, Json]:
    """Every leaf of a JSON value by its dotted path; empty lists and objects are leaves."""
    if isinstance(value, dict) and value:
        out: dict[str, Json] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value:
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}.{index}" if prefix else str(index)))
        return out
    return {prefix: value}


def _compare(case: str, step: str, kafka: Json, pidctl: Json, prefix: str) -> list[Difference]:
    left, right = flatten(kafka, prefix), flatten(pidctl, prefix)
    found = []
    for path in sorted(left.keys() | right.keys()):
        a, b = left.get(path, ABSENT), right.get(path, ABSENT)
        if a != b:
            found.append(Difference(case, step, path, a, b))
    return found


def differences(
    case: str, kafka_steps: Sequence[Json], pidctl_steps: Sequence[Json]
) -> list[Difference]:
    """Every difference between Kafka's steps (a golden file's) and pidctl's, requests
    included (a differing request means the golden file is stale)."""
    found: list[Difference] = []
    names = [s["step"] for s in kafka_steps], [s["step"] for s in pidctl_steps]
    if names[0] != names[1]:
        return [Difference(case, "*", "steps", names[0], names[1])]
    for kafka, pidctl in zip(kafka_steps, pidctl_steps, strict=True):
        step = kafka["step"]
        for part in ("listener", "request", "client_id", "repeat"):
            found += _compare(case, step, kafka.get(part), pidctl.get(part), part)
        found += _compare(case, step, kafka.get("answers"), pidctl.get("answers"), "answers")
        found += _compare(case, step, kafka["answer"], pidctl["answer"], "answer")
    return found


def undeclared(found: Iterable[Difference], declared: Iterable[Deliberate]) -> list[Difference]:
    """The differences no declaration covers."""
    declared = tuple(declared)
    return [d for d in found if not any(item.matches(d) for item in declared)]


def unused(found: Iterable[Difference], declared: Iterable[Deliberate]) -> list[Deliberate]:
    """The declarations that cover no difference (stale: the difference is gone)."""
    found = tuple(found)
    return [item for item in declared if not any(item.matches(d) for d in found)]


#: Every difference pidctl keeps on purpose, by the id of its entry in
#: docs/kafka-conformance.md (one id may need more than one pattern).
DELIBERATE: tuple[Deliberate, ...] = (
    Deliberate(
        "apis-not-served",
        "pidctl serves only the APIs of producer ids; Kafka lists every API it serves",
        case="api-versions-*",
        path="answer.api_keys.*",
        pidctl=ABSENT,
    ),
    Deliberate(
        "apis-not-served",
        "the same, on the SASL listener",
        case="authorization",
        step="api-versions",
        path="answer.api_keys.*",
        pidctl=ABSENT,
    ),
    Deliberate(
        "apis-not-served",
        "the same, asked with a client id that is not UTF-8 or with header tags",
        case="header-*",
        step="api-versions-*",
        path="answer.api_keys.*",
        pidctl=ABSENT,
    ),
    Deliberate(
        "apis-not-served",
        "the same, asked with bytes after the body or before SASL authentication",
        case=("request-trailing-bytes", "sasl-exchange"),
        step="api-versions-*",
        path="answer.api_keys.*",
        pidctl=ABSENT,
    ),
    Deliberate(
        "one-listener",
        "pidctl answers the controller APIs on the listener Kafka keeps for brokers' clients",
        case="api-versions-broker",
        path=("answer.api_keys.62", "answer.api_keys.63", "answer.api_keys.67"),
        kafka=ABSENT,
    ),
    Deliberate(
        "one-listener",
        "the same, on the SASL listener",
        case="authorization",
        step="api-versions",
        path=("answer.api_keys.62", "answer.api_keys.63", "answer.api_keys.67"),
        kafka=ABSENT,
    ),
    Deliberate(
        "one-listener",
        "the same, asked with a client id that is not UTF-8 or with header tags",
        case="header-*",
        step="api-versions-*",
        path=("answer.api_keys.62", "answer.api_keys.63", "answer.api_keys.67"),
        kafka=ABSENT,
    ),
    Deliberate(
        "one-listener",
        "the same, asked with bytes after the body or before SASL authentication",
        case=("request-trailing-bytes", "sasl-exchange"),
        step="api-versions-*",
        path=("answer.api_keys.62", "answer.api_keys.63", "answer.api_keys.67"),
        kafka=ABSENT,
    ),
    Deliberate(
        "one-listener",
        "pidctl answers the producers' APIs on the listener Kafka keeps for its controller",
        case="api-versions-controller",
        path=("answer.api_keys.3", "answer.api_keys.10", "answer.api_keys.22"),
        kafka=ABSENT,
    ),
    Deliberate(
        "api-versions-v5",
        "kio has no schema of ApiVersions v5: pidctl serves v0-v4",
        case="*",
        path="answer.api_keys.18",
        kafka="0..5",
        pidctl="0..4",
    ),
    Deliberate(
        "sasl-handshake-v0",
        "pidctl does not do the raw-token SASL exchange SaslHandshake v0 begins",
        path="answer.api_keys.17",
        kafka="0..1",
        pidctl="1..1",
    ),
    Deliberate(
        "no-features",
        "pidctl lists no features, so Kafka 4 clients keep the classic transaction protocol",
        path="answer.*_features*",
    ),
    Deliberate(
        "transactional-id-length",
        "a transactional id longer than a STRING carries: INVALID_REQUEST instead of a close",
        case="init-transactional-invalid-v5",
        step="id-too-long",
        path="answer.*",
    ),
    Deliberate(
        "request-bounds",
        "more FindCoordinator keys or Metadata topics than pidctl's bounds: INVALID_REQUEST",
        case="find-coordinator",
        step="v4-too-many-keys",
        path="answer.coordinators.*",
        changes_class=True,
    ),
    Deliberate(
        "request-bounds",
        "the same, for Metadata",
        case="metadata",
        step="v12-too-many-topics",
        path="answer.*",
        changes_class=True,
    ),
    Deliberate(
        "no-log-directories",
        "pidctl registers a broker without log directories: its brokers need none",
        case="broker-registration",
        step="*no-log-dir",
        path="answer.*",
        changes_class=True,
    ),
    Deliberate(
        "no-log-directories",
        "nor does it look at the directories a broker names (reserved, repeated, another's)",
        case="broker-registration-checks",
        step=("*director*"),
        path=("answer.error_code", "answer.broker_epoch"),
        changes_class=True,
    ),
    Deliberate(
        "registration-features",
        "pidctl finalizes no feature, so any a broker supports (or none) will do",
        case="broker-registration-checks",
        step="*feature*",
        path=("answer.error_code", "answer.broker_epoch"),
        changes_class=True,
    ),
    Deliberate(
        "registration-features",
        "the same, for a broker that names no metadata.version",
        case="broker-registration-checks",
        step="no-metadata-version",
        path=("answer.error_code", "answer.broker_epoch"),
        changes_class=True,
    ),
    Deliberate(
        "registration-features",
        "the same, for one whose metadata.version range lacks Kafka's level",
        case="broker-registration-checks",
        step="metadata-version-not-covered",
        path=("answer.error_code", "answer.broker_epoch"),
        changes_class=True,
    ),
    Deliberate(
        "registration-features",
        "and so the brokers both register get other epochs (pidctl registered more before)",
        case="broker-registration-checks",
        step=("no-listener"),
        path="answer.broker_epoch",
        changes_class=True,
    ),
    Deliberate(
        "epoch-exhausted-stale-pair",
        "a stale pair at epoch 32766: PRODUCER_FENCED, not Kafka's internal error",
        case="init-epoch-exhaustion",
        step="stale-pair-at-32766",
        path="answer.error_code",
        kafka=-1,
        pidctl=90,
        changes_class=True,
    ),
    Deliberate(
        "metadata-neither-name-nor-id",
        "a Metadata topic with neither a name nor an id: INVALID_REQUEST, not Kafka's "
        "internal error",
        case="metadata-topic-names",
        step="v1?-neither",
        path=("answer.error_code", "answer.topics.0.error_code"),
        kafka=-1,
        pidctl=42,
    ),
    Deliberate(
        "negative-broker-id",
        "a negative broker id is INVALID_REQUEST: -1 marks a job's AllocateProducerIds",
        case="broker-registration-negative-id",
        path="answer.*",
        changes_class=True,
    ),
    Deliberate(
        "caught-up-at-once",
        "pidctl has no metadata log for brokers to replay: a broker is caught up at once",
        case="broker-heartbeat",
        step="not-caught-up",
        path="answer.is_*",
    ),
    Deliberate(
        "jobs",
        "AllocateProducerIds from a job (BrokerId -1) is pidctl's extension; Kafka has no jobs",
        case="allocate-for-jobs",
        path="answer.*",
        changes_class=True,
    ),
    Deliberate(
        "app-id-authorization",
        "a named job needs Write on its AppId, as a transactional id on its TransactionalId: "
        "refused as one is; Kafka refuses BrokerId -1 for want of ClusterAction",
        case="authorization",
        step="allocate-for-a-named-job",
        path="answer.error_code",
        kafka=31,
        pidctl=53,
    ),
)
