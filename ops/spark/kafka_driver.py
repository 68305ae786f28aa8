"""The driver's side of ``pidctl-kafka``: what is decided before any task writes, and after
the last one.

Before (:func:`plan_write`): the job version's blocks from pidctl — or word that the version
completed already (``core/job_commits.py``), when the run writes nothing — then, from the
brokers: their ``producer.id.expiration.ms`` (DescribeConfigs; sent to pidctl with the
version's name, which refuses a re-run older than it), the cluster's own newest producer id
(an idempotent InitProducerId: the job's ids must lie ``pidHeadroom`` above it), the active
producers of the topic (none of another may hold a job's PID), and for a re-run, what the
version's PIDs wrote already: the topic's partition count then (from the batches' stamps,
``kafka_records.py``) must be the topic's now, and the first run recent enough that the
brokers still know its sequences. Every refusal comes before any task runs.

After (:func:`commit_version`): the version is committed at pidctl, so that a re-run writes
nothing; a summary of what each task wrote, and found written, goes to the log at WARNING
(the level a Spark driver shows).

pidctl is asked again, after a pause, while it does not answer (a restart) or throttles the
job (``throttle_time_ms``, THROTTLING_QUOTA_EXCEEDED), for as long as the write's budget
(``kafka.delivery.timeout.ms``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from pidctl.client import AuthenticationError, SyncClient
from pidctl.controller.core.kafka import BLOCK_SIZE
from pidctl.protocol import requests
from pidctl.spark.allocation import JOB_EPOCH, JobAllocation, PreallocationError
from pidctl.spark.kafka_cluster import (
    KafkaCluster,
    KafkaUnavailable,
    KafkaWriteError,
    ProducerState,
    TopicPartition,
)
from pidctl.spark.kafka_options import KafkaSinkOptions

log = logging.getLogger("pidctl.spark")

#: Kafka's default ``producer.id.expiration.ms`` (one day): assumed only when the brokers
#: do not tell theirs (DescribeConfigs refused), with a warning.
KAFKA_DEFAULT_EXPIRATION_MS = 86_400_000
#: The job key's prefix (``controller/core/jobs.py``), and what a commit's key holds in the
#: block's place (``controller/core/job_commits.py``).
JOB_KEY_PREFIX = "pidctl-job/"
COMMIT = "commit"
#: The first pause before pidctl is asked again, and the longest.
PIDCTL_BACKOFF_S = 0.1
PIDCTL_BACKOFF_MAX_S = 2.0

#: What pidctl's refusals of a named job version mean (controller/core/jobs.py).
KEY_REFUSALS = {
    ErrorCode.producer_fenced: (
        "a later version of the app has run, and this one never completed: it cannot be "
        "run again (its producer ids are gone)"
    ),
    ErrorCode.unknown_producer_id: (
        "pidctl cannot tell that the brokers still know its PIDs' sequences: its first run is "
        "older than pidctl's job_allocation_reuse_ms or the brokers' producer.id.expiration.ms, "
        "or its age is unknown (pidctl's clock is behind its record), or its record may have "
        "been lost with a damaged tail of pidctl's log; a re-run could write twice: run it as "
        "a new txnVersion"
    ),
    ErrorCode.transactional_id_authorization_failed: (
        "this principal may not write the app id (no ACL allowing Write on the AppId "
        "resource), or another principal owns it"
    ),
    ErrorCode.policy_violation: (
        "this principal already owns pidctl's max_job_app_ids_per_principal app ids"
    ),
    ErrorCode.invalid_request: (
        "pidctl refused the job's name (longer than max_job_app_id_bytes, not UTF-8, or "
        "pidctl runs in a fleet with pid_source, which serves no named job)"
    ),
}


class VersionCommitted(Exception):
    """The job version completed before: a run of it writes nothing."""


def job_key(app_id: str, version: int, block: int | str, max_age_ms: int | None = None) -> str:
    """The client id naming block ``block`` (or ``commit``) of a job version."""
    age = "" if max_age_ms is None else f"~{max_age_ms}"
    return f"{JOB_KEY_PREFIX}{version}/{block}{age}/{app_id}"


# -- pidctl ---------------------------------------------------------------------------------


def _ask_pidctl(
    bootstrap: str,
    keys: Sequence[str],
    *,
    budget_s: float,
    connection: dict[str, Any],
    timeout_s: float = 30.0,
) -> list[Any]:
    """One AllocateProducerIds per client id in ``keys``, pipelined, in order; an answer
    throttled (THROTTLING_QUOTA_EXCEEDED) is asked again after its ``throttle_time_ms``, and
    an unreachable pidctl after a pause, for ``budget_s`` at most."""
    answers: list[Any] = []
    started, pause, why = time.monotonic(), PIDCTL_BACKOFF_S, ""
    while len(answers) < len(keys):
        remaining = list(keys[len(answers) :])
        try:
            client = SyncClient(bootstrap, client_id=remaining[0], timeout=timeout_s, **connection)
            with client:
                got = client.pipeline([requests.allocate(-1, -1)] * len(remaining), remaining)
        except AuthenticationError as e:
            raise PreallocationError(f"pidctl at {bootstrap}: {e}") from e
        except OSError as e:
            got, why = [], f"pidctl at {bootstrap}: {e}"
        wait = pause
        for answer in got:
            if answer.error_code == ErrorCode.throttling_quota_exceeded:
                wait = max(wait, int(answer.throttle_time_ms.total_seconds() * 1000) / 1000)
                why = f"pidctl throttled the job ({answer.throttle_time_ms})"
                break
            answers.append(answer)
        if len(answers) == len(keys):
            break
        if time.monotonic() - started + wait > budget_s:
            raise PreallocationError(f"{why}; gave up after {budget_s:.0f} s")
        time.sleep(wait)
        pause = min(pause * 2, PIDCTL_BACKOFF_MAX_S)
    return answers


@dataclass(frozen=True, slots=True)
class NamedBlocks:
    """A job version's blocks; ``committed``: the version completed before (the blocks are
    then those pidctl still names for it, possibly none)."""

    allocation: JobAllocation
    committed: bool


def allocate_named(
    bootstrap: str,
    count: int,
    app_id: str,
    version: int,
    *,
    max_age_ms: int | None = None,
    budget_s: float = 120.0,
    connection: dict[str, Any] | None = None,
) -> NamedBlocks:
    """The blocks of job version ``(app_id, version)`` for ``count`` partitions: the same
    ones every time it is asked for (pidctl records them), all pipelined over one
    connection. A version pidctl says completed (DUPLICATE_SEQUENCE_NUMBER) comes back
    ``committed``; any other refusal raises :class:`PreallocationError` saying why."""
    wanted = max(1, math.ceil(count / BLOCK_SIZE))
    keys = [job_key(app_id, version, block, max_age_ms) for block in range(wanted)]
    answers = _ask_pidctl(bootstrap, keys, budget_s=budget_s, connection=connection or {})
    blocks, committed = [], False
    for answer in answers:
        if answer.error_code == ErrorCode.duplicate_sequence_number:
            committed = True
            if answer.producer_id_len:
                blocks.append((int(answer.producer_id_start), int(answer.producer_id_len)))
            continue
        if answer.error_code:
            why = KEY_REFUSALS.get(answer.error_code, "")
            raise PreallocationError(
                f"pidctl refused version {version} of {app_id!r}: {answer.error_code.name.upper()}"
                + (f": {why}" if why else "")
            )
        blocks.append((int(answer.producer_id_start), int(answer.producer_id_len)))
    return NamedBlocks(JobAllocation(app_id, tuple(blocks)), committed)


def allocate_unnamed(
    bootstrap: str,
    count: int,
    client_id: str,
    *,
    budget_s: float = 120.0,
    connection: dict[str, Any] | None = None,
) -> JobAllocation:
    """Fresh blocks for ``count`` partitions of a run without a name."""
    wanted = max(1, math.ceil(count / BLOCK_SIZE))
    answers = _ask_pidctl(
        bootstrap, [client_id] * wanted, budget_s=budget_s, connection=connection or {}
    )
    blocks = []
    for answer in answers:
        if answer.error_code:
            raise PreallocationError(
                f"pidctl refused a block for {client_id}: {answer.error_code.name.upper()}"
            )
        blocks.append((int(answer.producer_id_start), int(answer.producer_id_len)))
    return JobAllocation(client_id, tuple(blocks))


def commit_version(
    bootstrap: str,
    app_id: str,
    version: int,
    *,
    budget_s: float = 120.0,
    connection: dict[str, Any] | None = None,
) -> None:
    """Record at pidctl that the version completed (a re-run then writes nothing)."""
    (answer,) = _ask_pidctl(
        bootstrap,
        [job_key(app_id, version, COMMIT)],
        budget_s=budget_s,
        connection=connection or {},
    )
    if answer.error_code:
        why = KEY_REFUSALS.get(answer.error_code, "")
        raise PreallocationError(
            f"pidctl refused the commit of version {version} of {app_id!r}: "
            f"{answer.error_code.name.upper()}" + (f": {why}" if why else "")
        )


# -- the brokers ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WritePlan:
    """What the tasks of one write are told, decided on the driver: the topic's partition
    count to hold to, which Spark partitions' PIDs wrote already (their tasks check what was
    written before they send), when the version's first run started, and the brokers'
    ``producer.id.expiration.ms``."""

    partitions: dict[str, int] = field(default_factory=dict)
    resumed: frozenset[int] = frozenset()
    started_ms: int = 0
    expiration_ms: int = KAFKA_DEFAULT_EXPIRATION_MS
    #: The cluster's own newest producer id when the write started (-1: not asked).
    cluster_producer_id: int = -1
    #: Per Spark partition whose PID wrote already: per Kafka partition, the last sequence
    #: written and the fingerprint through it (what a check of a re-run compares).
    expected: dict[int, list[tuple[str, int, int, int]]] = field(default_factory=dict)

    def resume(self, spark_partition: int, attempt: int) -> bool:
        """Whether a task must ask what its PID wrote before it writes."""
        return attempt > 0 or spark_partition in self.resumed

    def check_age(self, now_ms: int) -> None:
        """Refuse to go on once the brokers may have forgotten what the version's PIDs
        wrote: its first run started ``expiration_ms`` or longer ago."""
        if self.started_ms and now_ms - self.started_ms >= self.expiration_ms:
            hours = (now_ms - self.started_ms) / 3_600_000
            raise KafkaWriteError(
                f"the job version's first run started {hours:.1f} h ago, at least the brokers' "
                f"producer.id.expiration.ms ({self.expiration_ms} ms): they may have forgotten "
                "what it wrote, and this attempt would write it again; run it as a new "
                "version (and keep jobs shorter than the expiration)"
            )


def expiration_ms(cluster: KafkaCluster, option: int | None) -> int:
    """The brokers' ``producer.id.expiration.ms`` (DescribeConfigs), the option's value when
    given, or Kafka's default when the brokers do not tell (with a warning)."""
    if option is not None:
        return option
    value, who = cluster.broker_config("producer.id.expiration.ms")
    if value is None:
        log.warning(
            "pidctl-kafka: %s; assuming Kafka's default producer.id.expiration.ms %d "
            "(set option producerIdExpirationMs to the brokers' value)",
            who,
            KAFKA_DEFAULT_EXPIRATION_MS,
        )
        return KAFKA_DEFAULT_EXPIRATION_MS
    return int(value)


def check_pid_range(allocation: JobAllocation, cluster_producer_id: int, headroom: int) -> None:
    """Refuse a job whose producer ids are not ``headroom`` above the newest one the
    cluster's own allocator hands out (``cluster_producer_id``). The cluster hands out ids
    upwards from 0, a block of 1000 at a time per broker; an id of the job's that it
    reached would have the job's rows taken for another producer's, or the other way round.
    (Ids seen on the topic are no measure: the job's earlier versions show there too.)"""
    lowest = min(first for first, _ in allocation.blocks) if allocation.blocks else None
    if lowest is not None and lowest <= cluster_producer_id + headroom:
        raise KafkaWriteError(
            f"refusing to write: the job's producer ids (from {lowest}) are not above the "
            f"cluster's own (it hands out {cluster_producer_id} now) by pidHeadroom "
            f"({headroom}): the cluster would hand out the same ids. Give the pidctl serving "
            "jobs a range of its own (first_producer_id = 4611686018427387904, "
            "docs/spark-kafka.md)"
        )


def foreign_producers(
    allocation: JobAllocation, found: dict[TopicPartition, list[ProducerState]], fresh: bool
) -> list[str]:
    """Active producers on the target partitions whose PID lies in the job's blocks and that
    are not the job's own: any, if the blocks are fresh; else one with another epoch or in a
    transaction (the job's PIDs always produce with epoch 0, never transactionally)."""
    ranges = [(first, first + length) for first, length in allocation.blocks]
    strangers = []
    for (topic, partition), producers in sorted(found.items()):
        for p in producers:
            if not any(first <= p.producer_id < end for first, end in ranges):
                continue
            if fresh or p.epoch != JOB_EPOCH or p.current_txn_start_offset != -1:
                strangers.append(f"{topic}-{partition}: producer {p.producer_id} epoch {p.epoch}")
    return strangers


def spark_partition_of(allocation: JobAllocation, producer_id: int) -> int | None:
    """The Spark partition whose PID ``producer_id`` is, None if it is not the job's."""
    index = 0
    for first, length in allocation.blocks:
        if first <= producer_id < first + length:
            return index + producer_id - first
        index += length
    return None


def broker_expiration(options: KafkaSinkOptions) -> int:
    """The brokers' ``producer.id.expiration.ms`` (:func:`expiration_ms`), asked again
    while they do not answer."""
    cluster = options.cluster()
    try:
        return int(_retrying(options, lambda: expiration_ms(cluster, options.expiration_ms)))
    finally:
        cluster.close()


def partition_counts(options: KafkaSinkOptions, topics: Iterable[str]) -> dict[str, int]:
    """Each topic's partition count now (Metadata)."""
    cluster = options.cluster()
    try:
        return {
            topic: int(_retrying(options, lambda t=topic: cluster.layout(t).partitions))
            for topic in topics
        }
    finally:
        cluster.close()


def cluster_producer_id(options: KafkaSinkOptions) -> int:
    """The cluster's own newest producer id (:meth:`KafkaCluster.cluster_producer_id`)."""
    cluster = options.cluster()
    try:
        return int(_retrying(options, cluster.cluster_producer_id))
    finally:
        cluster.close()


def plan_write(
    options: KafkaSinkOptions,
    allocation: JobAllocation,
    *,
    fresh: bool,
    expiration: int,
    topics: Iterable[str] = (),
    now_ms: int | None = None,
) -> WritePlan:
    """The checks before any task of a write runs, against the brokers (module doc), and
    what the tasks are told. ``fresh``: the blocks were granted now (a run without a
    name); ``expiration``: the brokers' ``producer.id.expiration.ms``."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    cluster = options.cluster()
    try:
        partitions: dict[str, int] = {}
        expected: dict[int, list[tuple[str, int, int, int]]] = {}
        started = now_ms
        for topic in topics:
            layout = _retrying(options, lambda t=topic: cluster.layout(t))
            partitions[topic] = layout.partitions
            found = _retrying(
                options,
                lambda t=topic, n=layout.partitions: cluster.describe_producers(
                    (t, p) for p in range(n)
                ),
            )
            strangers = foreign_producers(allocation, found, fresh)
            if strangers:
                raise KafkaWriteError(
                    f"refusing to write to {topic!r}: its partitions show producers in the "
                    f"job's PID range that are not the job's ({'; '.join(strangers[:5])}): the "
                    "cluster hands out the same PIDs as pidctl; give pidctl a range of its own "
                    "(first_producer_id, docs/spark-kafka.md)"
                )
            for tp, producers in found.items():
                for producer in producers:
                    partition = spark_partition_of(allocation, producer.producer_id)
                    if partition is None:
                        continue
                    stamp = _stamp(cluster, options, tp, producer)
                    expected.setdefault(partition, []).append(
                        (tp[0], tp[1], producer.last_sequence, stamp.fingerprint)
                    )
                    if stamp.partitions != layout.partitions:
                        raise KafkaWriteError(
                            f"refusing to write to {topic!r}: the job version's first run wrote "
                            f"when it had {stamp.partitions} partitions; it has "
                            f"{layout.partitions} now, so keyed rows would go to other "
                            "partitions than the first run's did (rows twice, others "
                            "missing): run it as a new version"
                        )
                    started = min(started, stamp.started_ms)
        cluster_id = _retrying(options, cluster.cluster_producer_id)
    finally:
        cluster.close()
    check_pid_range(allocation, cluster_id, options.pid_headroom)
    plan = WritePlan(partitions, frozenset(expected), started, expiration, cluster_id, expected)
    plan.check_age(now_ms)
    return plan


def _stamp(
    cluster: KafkaCluster, options: KafkaSinkOptions, tp: TopicPartition, producer: ProducerState
) -> Any:
    from pidctl.spark.kafka_records import FINGERPRINT_HEADER, Stamp

    found = _retrying(
        options,
        lambda: cluster.find_batch(
            tp, producer.producer_id, producer.last_sequence, producer.last_timestamp
        ),
    )
    stamp = None if found is None else Stamp.read(found.records()[0].header(FINGERPRINT_HEADER))
    if stamp is None:
        raise KafkaWriteError(
            f"{tp[0]}-{tp[1]}: cannot read what producer {producer.producer_id} of the job "
            f"version wrote through sequence {producer.last_sequence} (its last batch is gone, "
            "or was not written by this version of pidctl-kafka): a re-run cannot check its "
            "rows are the same; run it as a new version"
        )
    return stamp


def _retrying(options: KafkaSinkOptions, ask: Any) -> Any:
    """``ask()`` again after a pause while the brokers do not answer, within the write's
    delivery timeout."""
    budget = options.producer.delivery_timeout_s
    started, pause = time.monotonic(), options.producer.retry_backoff_s
    while True:
        try:
            return ask()
        except KafkaUnavailable as e:
            if time.monotonic() - started + pause > budget:
                raise KafkaWriteError(f"{e} (gave up after {budget:.0f} s)") from e
            time.sleep(pause)
            pause = min(pause * 2, options.producer.retry_backoff_max_s)


# -- the summary ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionCount:
    """Rows of one Kafka partition, over every task that wrote to it."""

    topic: str
    partition: int
    rows: int
    written: int
    present: int


@dataclass(frozen=True, slots=True)
class WriteSummary:
    """What a write did: rows, rows written by it, rows found written already, per Kafka
    partition; ``state``: ``written`` or ``skipped`` (a completed version)."""

    app_id: str | None
    version: int | None
    state: str
    rows: int
    written: int
    present: int
    partitions: tuple[PartitionCount, ...]

    def line(self) -> str:
        """One line for the driver's log."""
        name = "" if self.app_id is None else f"txnAppId {self.app_id!r} version {self.version}: "
        if self.state == "skipped":
            return (
                f"pidctl-kafka: {name}completed before; this run wrote nothing "
                f"({self.rows} rows read)"
            )
        parts = ", ".join(
            f"{p.topic}-{p.partition} {p.written}+{p.present}" for p in self.partitions[:20]
        )
        more = f" and {len(self.partitions) - 20} more" if len(self.partitions) > 20 else ""
        return (
            f"pidctl-kafka: {name}{self.rows} rows: {self.written} written, {self.present} "
            f"already present (per partition, written+present: {parts}{more})"
        )


def summarize(
    reports: Iterable[Any], app_id: str | None, version: int | None, *, skipped: bool = False
) -> WriteSummary:
    """The summary of the tasks' reports (``kafka_producer.PartitionReport``)."""
    by_partition: dict[TopicPartition, list[int]] = {}
    for report in reports:
        counts = by_partition.setdefault((report.topic, report.partition), [0, 0, 0])
        counts[0] += report.rows
        counts[1] += report.written
        counts[2] += report.skipped
    partitions = tuple(
        PartitionCount(topic, partition, *counts)
        for (topic, partition), counts in sorted(by_partition.items())
    )
    return WriteSummary(
        app_id,
        version,
        "skipped" if skipped else "written",
        sum(p.rows for p in partitions),
        sum(p.written for p in partitions),
        sum(p.present for p in partitions),
        partitions,
    )
