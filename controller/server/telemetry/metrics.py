"""Prometheus metrics (served with /healthz and /readyz by ``transport/http.py``).

Counters and histograms are updated on the event loop as things happen, without a lock
(``loop_metrics.py``); gauges about the state (PID space, brokers, transactional ids) are
read at scrape time by a collector, so the request path pays nothing for them.
"""

from __future__ import annotations

import functools
import platform
import time
from collections.abc import Iterable, Iterator
from typing import Any, Final

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from pidctl.controller.core.cluster import ClusterControlManager
from pidctl.controller.core.state import ControllerState
from pidctl.controller.server.telemetry.logs import log_write_failures
from pidctl.controller.server.telemetry.loop_metrics import LoopCounter, LoopHistogram
from pidctl.protocol import __version__
from pidctl.protocol.apis import ApiKey
from pidctl.protocol.build import BUILD

_LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
_FSYNC_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
_BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


@functools.cache
def api_name(api_key: int) -> str:
    """The metric label of an API key (cached: it is asked for on every request)."""
    try:
        return ApiKey(api_key).name.lower()
    except ValueError:
        return str(api_key)


class RateWindow:
    """PIDs granted per second over the last ``window_s`` seconds, in one-minute buckets
    (bounded memory whatever the grant rate)."""

    def __init__(self, window_s: int = 3600, bucket_s: int = 60) -> None:
        self.window_s = window_s
        self.bucket_s = bucket_s
        self._buckets: dict[int, int] = {}

    def add(self, count: int, now_s: float) -> None:
        bucket = int(now_s // self.bucket_s)
        buckets = self._buckets
        if bucket in buckets:
            buckets[bucket] += count
            return
        # A new bucket: the only time one can have fallen out of the window.
        buckets[bucket] = count
        oldest = bucket - self.window_s // self.bucket_s
        for stale in [b for b in buckets if b <= oldest]:
            del buckets[stale]

    def per_second(self, now_s: float) -> float:
        oldest = int(now_s // self.bucket_s) - self.window_s // self.bucket_s
        return sum(c for b, c in list(self._buckets.items()) if b > oldest) / self.window_s


class _StateCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield CounterMetricFamily(
            "pidctl_log_write_failures",
            "Log lines that could not be written to stderr (dropped; the server goes on).",
            value=log_write_failures(),
        )
        now = time.time()
        if self._metrics.last_snapshot_time is not None:
            yield GaugeMetricFamily(
                "pidctl_snapshot_age_seconds",
                "Seconds since the state was last written whole: since the newest snapshot "
                "(written by this process, or found at start-up), or, before the data dir's "
                "first snapshot, since the log began (its first record).",
                value=now - self._metrics.last_snapshot_time,
            )


class StateGauges(Collector):
    """The controller's state as gauges, read at scrape time: registered on the metrics'
    registry by the rooms once the state is recovered (before that there is none to show)."""

    def __init__(self, state: ControllerState, grant_rate: RateWindow) -> None:
        self._state = state
        self._grant_rate = grant_rate

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = self._state
        cluster, producer_ids = state.cluster, state.producer_ids
        remaining = producer_ids.remaining()
        rate = self._grant_rate.per_second(time.time())
        projection = remaining / rate if rate > 0 else float("inf")
        values: Iterable[tuple[str, str, float]] = (
            (
                "pidctl_next_producer_id",
                "The lowest producer id never granted.",
                producer_ids.next_producer_id,
            ),
            (
                "pidctl_producer_ids_remaining",
                "Producer ids still grantable in whole blocks.",
                remaining,
            ),
            (
                "pidctl_producer_ids_exhaustion_seconds",
                "Seconds until the range runs out at the grant rate of the last hour (+Inf: none).",
                projection,
            ),
            (
                "pidctl_registered_brokers",
                "Brokers with a current registration.",
                len(cluster.brokers),
            ),
            ("pidctl_fenced_brokers", "Registered brokers that are fenced.", _fenced(cluster)),
            (
                "pidctl_transactional_ids",
                "Transactional ids held.",
                len(state.transactions.transactional_ids),
            ),
            (
                "pidctl_pid_lease_remaining",
                "Producer ids left in the leases held from etcd (0 without pid_source).",
                state.leases.remaining(),
            ),
        )
        for name, doc, value in values:
            yield GaugeMetricFamily(name, doc, value=value)


def _fenced(cluster: ClusterControlManager) -> int:
    """Registered brokers fenced now (by the controller's clock: monotonic milliseconds)."""
    mono_ms = time.monotonic_ns() // 1_000_000
    return sum(cluster.is_fenced(broker, mono_ms) for broker in list(cluster.brokers))


class Metrics:
    """Every metric pidctl exports, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds,
        # process_max_fds, process_start_time_seconds (a restart shows as a new start time).
        ProcessCollector(registry=r)
        build = Gauge(
            "pidctl_build_info",
            "Always 1: the running pidctl's version, Python, and build (compiled or interpreted).",
            ["version", "python", "build"],
            registry=r,
        )
        build.labels(__version__, platform.python_version(), BUILD).set(1)
        self.requests = LoopCounter(
            "pidctl_requests", "Requests answered.", ["api", "version"], registry=r
        )
        self.errors = LoopCounter(
            "pidctl_request_errors",
            "Requests answered with an error code.",
            ["api", "version", "error"],
            registry=r,
        )
        self.latency = LoopHistogram(
            "pidctl_request_duration_seconds",
            "From a request's arrival to its response being sent (durability included).",
            ["api"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.connections = Gauge("pidctl_connections", "Open client connections.", registry=r)
        self.connections_polled = Gauge(
            "pidctl_connections_polled",
            "Open client connections read by the shared poller now; the others wait in their "
            "own task (TLS, a SASL exchange, a throttle, a full outbox).",
            registry=r,
        )
        self.connections_accepted = LoopCounter(
            "pidctl_connections_accepted", "Client connections accepted.", registry=r
        )
        self.connections_closed = LoopCounter(
            "pidctl_connections_closed",
            "Client connections closed, by reason.",
            ["reason"],
            registry=r,
        )
        self.connections_muted = LoopCounter(
            "pidctl_connections_muted",
            "Times a connection was read no more until its answers were written, by reason "
            "(unwritten_bytes: they held max_unwritten_bytes_per_connection).",
            ["reason"],
            registry=r,
        )
        self.bytes_received = LoopCounter(
            "pidctl_received_bytes", "Bytes received from clients.", registry=r
        )
        self.bytes_sent = LoopCounter("pidctl_sent_bytes", "Bytes sent to clients.", registry=r)
        self.throttled = LoopCounter(
            "pidctl_throttled_requests",
            "Requests answered with throttle_time_ms > 0 (api=connection: delayed accepts).",
            ["api"],
            registry=r,
        )
        self.throttle_seconds = LoopCounter(
            "pidctl_throttle_seconds",
            "Time connections were muted or delayed by quotas.",
            ["api"],
            registry=r,
        )
        self.quota_refusals = LoopCounter(
            "pidctl_quota_refusals",
            "Requests refused undecided because their quota was used up (a request quota's, "
            "or their principal's producer_ids_rate): answered THROTTLING_QUOTA_EXCEEDED "
            "(AllocateProducerIds) or COORDINATOR_LOAD_IN_PROGRESS (InitProducerId), with "
            "throttle_time_ms, by API.",
            ["api"],
            registry=r,
        )
        self.producer_ids_created = LoopCounter(
            "pidctl_producer_ids_created",
            "Producer ids created for InitProducerId (idempotent, or a transactional id's first "
            "use or rotation) and for jobs' blocks (1,000 each; a block answered again to a "
            "re-run creates none), by principal.",
            ["principal"],
            registry=r,
        )
        self.producer_ids_throttled = LoopCounter(
            "pidctl_producer_ids_throttled",
            "Answers throttled by producer_ids_rate (new producer ids per principal), by "
            "principal.",
            ["principal"],
            registry=r,
        )
        self.producer_ids_throttle_seconds = LoopCounter(
            "pidctl_producer_ids_throttle_seconds",
            "Time connections were muted by producer_ids_rate, by principal.",
            ["principal"],
            registry=r,
        )
        self.authentication_failures = LoopCounter(
            "pidctl_authentication_failures",
            "Failed SASL authentications and TLS handshakes, by mechanism.",
            ["mechanism"],
            registry=r,
        )
        self.config_reloads = LoopCounter(
            "pidctl_config_reloads",
            "SIGHUP reloads by result: applied; refused (it would switch the authorizer off or "
            "remove every SASL credential: the previous configuration stays); failed (an error "
            "reading the configuration or the credentials: the previous one stays).",
            ["result"],
            registry=r,
        )
        self.transactional_ids_expired = LoopCounter(
            "pidctl_transactional_ids_expired",
            "Transactional ids expired (unused past transactional_id_expiration_ms).",
            registry=r,
        )
        self.log_appends = LoopCounter(
            "pidctl_log_appended_records", "Records made durable.", registry=r
        )
        self.log_bytes = LoopCounter(
            "pidctl_log_appended_bytes",
            "Bytes of records made durable (a snapshot waits for as many as the last one's size).",
            registry=r,
        )
        self.fsync = LoopHistogram(
            "pidctl_log_fsync_duration_seconds",
            "Time of one group commit's write and fdatasync.",
            buckets=_FSYNC_BUCKETS,
            registry=r,
        )
        self.commits_in_thread = LoopCounter(
            "pidctl_log_commits_in_thread",
            "Group commits run in the log's thread rather than on the event loop: after a "
            "sync that took log_inline_sync_max_ms or more, or because no answer waits for "
            "them (the grant of a block InitProducerId's pool prefetches).",
            registry=r,
        )
        self.slow_commits_on_loop = LoopCounter(
            "pidctl_log_slow_commits_on_loop",
            "Group commits on the event loop that took log_inline_sync_max_ms or more (each "
            "held the loop up that long; a disk slow now and then sends commits to the "
            "thread for longer each time).",
            registry=r,
        )
        self.batch = LoopHistogram(
            "pidctl_log_commit_batch_records",
            "Records per group commit.",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.snapshot_bytes = Gauge(
            "pidctl_snapshot_bytes", "Size of the latest snapshot.", registry=r
        )
        self.audit_trail_floor_bytes = Gauge(
            "pidctl_audit_trail_floor_bytes",
            "Bytes of the audit trail (segments a snapshot covers) younger than "
            "log_retention_ms, kept whatever log_retention_bytes says (at the last snapshot).",
            registry=r,
        )
        self.recovery_seconds = Gauge(
            "pidctl_recovery_duration_seconds",
            "Time the last start-up took to recover the log.",
            registry=r,
        )
        self.blocks_granted = LoopCounter(
            "pidctl_producer_id_blocks_granted",
            "Blocks of producer ids granted, by holder.",
            ["holder", "broker"],
            registry=r,
        )
        self.lease_size = Gauge(
            "pidctl_pid_lease_size",
            "Producer ids per etcd lease (0 without pid_source).",
            registry=r,
        )
        self.leases = LoopCounter("pidctl_pid_leases", "Leases taken from etcd.", registry=r)
        self.etcd_latency = LoopHistogram(
            "pidctl_etcd_request_duration_seconds",
            "Round trips to etcd, by operation.",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.etcd_failures = LoopCounter(
            "pidctl_etcd_request_failures",
            "etcd requests that failed, by operation.",
            ["operation"],
            registry=r,
        )
        self.producer_id_refusals = LoopCounter(
            "pidctl_producer_id_refusals",
            "Requests refused because no producer id could be handed out, by API and reason: "
            "exhausted (the range is used up: an operator must act; /readyz fails), "
            "waiting (for a lease, or a block being made durable) or disk_space (grants "
            "paused: the data dir's filesystem below data_dir_min_free_bytes).",
            ["api", "reason"],
            registry=r,
        )
        self.data_dir_free_bytes = Gauge(
            "pidctl_data_dir_free_bytes",
            "Free bytes on the data dir's filesystem (statvfs, without root's reserve); "
            "below data_dir_min_free_bytes grants pause and /readyz fails.",
            registry=r,
        )
        self.grants_paused = Gauge(
            "pidctl_grants_paused",
            "1 while grants are paused because the data dir's filesystem is below "
            "data_dir_min_free_bytes (InitProducerId and AllocateProducerIds answered with "
            "retriable errors, nothing written); else 0.",
            registry=r,
        )
        self.etcd_counter_regressions = LoopCounter(
            "pidctl_etcd_counter_regressions",
            "Times the etcd counter was seen below the highest lease seen (deleted or set "
            "back): no lease is taken from it.",
            registry=r,
        )
        self.http_connections = Gauge(
            "pidctl_http_connections",
            "Open connections to the metrics and health endpoint (at most "
            "metrics_max_connections).",
            registry=r,
        )
        self.http_connections_evicted = LoopCounter(
            "pidctl_http_connections_evicted",
            "Connections to the metrics and health endpoint closed before their request was "
            "answered, by reason: full (metrics_max_connections were open when another came: "
            "the one waiting longest for its request made room), timeout (no whole request "
            "within metrics_request_timeout_ms).",
            ["reason"],
            registry=r,
        )
        self._blocks_granted: dict[tuple[str, int], Any] = {}
        self.grant_rate = RateWindow()
        self.last_snapshot_time: float | None = None
        #: A commit on the loop this slow or slower counts in ``slow_commits_on_loop``
        #: (``log_inline_sync_max_ms``; 0: every commit runs in the thread).
        self.slow_commit_s = float("inf")
        r.register(_StateCollector(self))

    def log_batch(self, records: int, size: int, seconds: float, in_thread: bool) -> None:
        self.log_appends.inc(records)
        self.log_bytes.inc(size)
        if in_thread:
            self.commits_in_thread.inc()
        elif seconds >= self.slow_commit_s:
            self.slow_commits_on_loop.inc()
        self.batch.observe(records)
        self.fsync.observe(seconds)

    def snapshot_written(self, size: int) -> None:
        self.snapshot_bytes.set(size)
        self.last_snapshot_time = time.time()

    def state_written_at(self, seconds: float) -> None:
        """At start-up: when the state was last written whole (the newest snapshot's time,
        or the log's first record's), from which ``pidctl_snapshot_age_seconds`` counts."""
        self.last_snapshot_time = seconds

    def etcd_request(self, operation: str, seconds: float, failed: bool) -> None:
        self.etcd_latency.labels(operation).observe(seconds)
        if failed:
            self.etcd_failures.labels(operation).inc()

    def granted(self, holder: str, broker_id: int, count: int) -> None:
        # The child resolved once per (holder, broker): labels() takes a lock and builds a key.
        child = self._blocks_granted.get((holder, broker_id))
        if child is None:
            child = self.blocks_granted.labels(holder, str(broker_id))
            self._blocks_granted[holder, broker_id] = child
        child.inc()
        self.grant_rate.add(count, time.time())
