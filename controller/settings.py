"""Every setting of ``pidctl serve``, typed and documented in one place.

Sources, highest precedence first: command-line flag, ``PIDCTL_<NAME>`` environment variable,
the TOML file given by ``--config``, the default below. Unknown or invalid settings stop
start-up with one line naming the setting.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pidctl.controller.api.access import (
    DEFAULT_MAX_COORDINATOR_KEYS,
    DEFAULT_MAX_METADATA_TOPICS,
    DEFAULT_MAX_REGISTRATION_ENTRIES,
)
from pidctl.controller.core.acl import Acl, AclError, parse_acl
from pidctl.controller.core.errors import PidctlError
from pidctl.controller.core.jobs import DEFAULT_EXPIRATION_MS as DEFAULT_JOB_EXPIRATION_MS
from pidctl.controller.core.jobs import DEFAULT_MAX_APP_ID_BYTES as DEFAULT_MAX_JOB_APP_ID_BYTES
from pidctl.controller.core.jobs import (
    DEFAULT_MAX_APP_IDS_PER_PRINCIPAL as DEFAULT_MAX_JOB_APP_IDS_PER_PRINCIPAL,
)
from pidctl.controller.core.jobs import DEFAULT_REUSE_MS as DEFAULT_JOB_REUSE_MS
from pidctl.controller.core.kafka import (
    BLOCK_SIZE,
    DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
    DEFAULT_SESSION_TIMEOUT_MS,
    DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS,
    INT64_MAX,
)
from pidctl.controller.core.pid_leases import DEFAULT_LEASE_SIZE, DEFAULT_PREFETCH_RATIO
from pidctl.controller.core.producer_ids import ProducerIdRange
from pidctl.controller.core.quotas import DEFAULT_MAX_BUCKETS, NEW_PRODUCER_IDS, QuotaOverride
from pidctl.controller.core.reservations import DEFAULT_RESERVATION_SIZE
from pidctl.controller.core.transactions import DEFAULT_EXPIRY_BATCH
from pidctl.controller.log.metalog import DEFAULT_SEGMENT_MAX_BYTES
from pidctl.controller.log.preallocation import (
    DEFAULT_PREALLOCATE_BYTES,
    MAX_PREALLOCATE_BYTES,
    MIN_PREALLOCATE_BYTES,
)
from pidctl.controller.log.snapshots import (
    DEFAULT_RETENTION_BYTES,
    DEFAULT_RETENTION_MS,
    DEFAULT_SNAPSHOT_INTERVAL_RECORDS,
    DEFAULT_SNAPSHOT_MIN_INTERVAL_S,
)
from pidctl.controller.log.space import DEFAULT_MIN_FREE_BYTES
from pidctl.controller.log.sync_place import DEFAULT_INLINE_SYNC_MAX_S
from pidctl.protocol import addresses
from pidctl.protocol.addresses import EtcdLocation, HostPort
from pidctl.protocol.framing import DEFAULT_MAX_FRAME_BYTES
from pidctl.protocol.sasl_client import MECHANISMS

#: Default of the ``max_entries_per_round`` setting: the work one connection's round may
#: decide before the other connections run, in entries (a FindCoordinator's keys, a
#: Metadata's topics; a request without an array counts 1). A key costs ~3 µs to decide and
#: encode here, so a round holds the event loop ~3 ms at most beyond its last request; the
#: requests of one round are still bounded by ``max_in_flight_per_connection`` too.
DEFAULT_MAX_ENTRIES_PER_ROUND = 1000
#: Default of the ``max_unwritten_bytes_per_connection`` setting: answers of one connection
#: held for a client that does not read them, before the connection is read no more. A
#: thousand-key answer is ~30 KB; most answers are tens of bytes.
DEFAULT_MAX_UNWRITTEN_BYTES = 1024 * 1024

ENV_PREFIX = "PIDCTL_"

#: The variables Kubernetes puts into every pod of a namespace with a Service named
#: ``pidctl`` (or ``pidctl-<x>``) while service links are on (the default), Docker-link
#: style: ``PIDCTL_SERVICE_HOST=10.0.0.11``, ``PIDCTL_SERVICE_PORT=9093``,
#: ``PIDCTL_SERVICE_PORT_METRICS=9464`` (a named port), ``PIDCTL_PORT=tcp://10.0.0.11:9093``,
#: ``PIDCTL_PORT_9093_TCP=tcp://10.0.0.11:9093`` and its ``_PROTO``, ``_PORT`` and ``_ADDR``.
#: Each is matched by name and by the shape of its value, so that anything else starting
#: with PIDCTL_ is still a setting, or an unknown one that stops start-up.
_HOST = r"[0-9A-Fa-f.:\[\]]+"
_PROTOCOLS = "tcp|udp|sctp"
_SERVICE_LINK_SHAPES = tuple(
    (re.compile(name), re.compile(value))
    for name, value in (
        (r"PIDCTL_(?:[A-Z0-9_]+_)?SERVICE_HOST", _HOST),
        (r"PIDCTL_(?:[A-Z0-9_]+_)?SERVICE_PORT(?:_[A-Z0-9_]+)?", r"\d+"),
        (r"PIDCTL_(?:[A-Z0-9_]+_)?PORT", rf"(?:{_PROTOCOLS})://{_HOST}:\d+"),
        (r"PIDCTL_(?:[A-Z0-9_]+_)?PORT_\d+_(?:TCP|UDP|SCTP)", rf"(?:{_PROTOCOLS})://{_HOST}:\d+"),
        (r"PIDCTL_(?:[A-Z0-9_]+_)?PORT_\d+_(?:TCP|UDP|SCTP)_PROTO", _PROTOCOLS),
        (r"PIDCTL_(?:[A-Z0-9_]+_)?PORT_\d+_(?:TCP|UDP|SCTP)_PORT", r"\d+"),
        (r"PIDCTL_(?:[A-Z0-9_]+_)?PORT_\d+_(?:TCP|UDP|SCTP)_ADDR", _HOST),
    )
)


def is_service_link_variable(name: str, value: str) -> bool:
    """Whether ``name=value`` is one of the variables Kubernetes' service links inject for a
    Service named ``pidctl`` (or ``pidctl-<x>``), rather than a setting."""
    return any(
        shape.fullmatch(name) is not None and values.fullmatch(value) is not None
        for shape, values in _SERVICE_LINK_SHAPES
    )


def service_link_variables(environ: Mapping[str, str]) -> list[str]:
    """The names in ``environ`` that settings ignore as Kubernetes service-link variables
    (``pidctl serve`` logs them in a warning)."""
    return sorted(
        key
        for key, value in environ.items()
        if key.startswith(ENV_PREFIX)
        and key[len(ENV_PREFIX) :].lower() not in SETTING_NAMES
        and is_service_link_variable(key, value)
    )


class SettingsError(PidctlError, ValueError):
    """One line per problem, naming the setting and what is wrong with it."""

    exit_code = 2


class ReloadRefused(SettingsError):
    """A config file a reload must not take: it could be one caught half written."""


Parse = Callable[[Any], Any]


def _setting(
    default: Any,
    doc: str,
    unit: str = "",
    *,
    parse: Parse | None = None,
    secret: bool = False,
    reload: bool = False,
) -> Any:
    """A setting: its default, what it means, its unit, and how a raw value (a string from a
    flag or the environment, or a TOML value) becomes the setting's type; by default by the
    default's type (an int must not be negative, a string is taken as it is). ``reload``:
    a running server takes a new value on SIGHUP (``AppState.reload``); every other setting
    takes a restart."""
    if parse is None:
        by_type: dict[type, Parse] = {int: NON_NEGATIVE, str: str, float: _number}
        parse = by_type[type(default)]
    metadata = {"doc": doc, "unit": unit, "secret": secret, "parse": parse, "reload": reload}
    return field(default=default, metadata=metadata)


def _integer(minimum: int | None) -> Parse:
    def parse(raw: Any) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise ValueError(f"expected an integer, got {raw!r}")
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
        if minimum == 1 and value < 1:
            raise ValueError(f"must be positive, got {value}")
        if minimum == 0 and value < 0:
            raise ValueError(f"must not be negative, got {value}")
        return value

    return parse


POSITIVE = _integer(1)
NON_NEGATIVE = _integer(0)
ANY_INTEGER = _integer(None)


def _zero_or_between(low: int, high: int) -> Parse:
    """0 (off), or an integer from ``low`` to ``high``."""

    def parse(raw: Any) -> int:
        value: int = NON_NEGATIVE(raw)
        if value != 0 and not low <= value <= high:
            raise ValueError(f"must be 0 or from {low} to {high}, got {value}")
        return value

    return parse


def _float(raw: Any) -> float:
    try:
        return float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"expected a number, got {raw!r}") from None


def _number(raw: Any) -> float:
    """A rate: finite and not negative."""
    value = _float(raw)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"must be a finite number >= 0, got {raw!r}")
    return value


def _fraction(raw: Any) -> float:
    value = _float(raw)
    if not 0 < value <= 1:
        raise ValueError(f"must be in (0, 1], got {raw!r}")
    return value


def _choice(*options: str) -> Parse:
    def parse(raw: Any) -> str:
        value = str(raw).lower()
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {raw!r}")
        return value

    return parse


def _address(raw: Any) -> HostPort:
    return HostPort.parse(str(raw))


def _optional_address(raw: Any) -> HostPort | None:
    return None if raw in (None, "") else _address(raw)


def _optional_text(raw: Any) -> str | None:
    return None if raw in (None, "") else str(raw)


def _path(raw: Any) -> Path:
    return Path(str(raw))


def _listeners(raw: Any) -> str:
    parse_listeners(str(raw))  # validates
    return str(raw)


def _pid_source(raw: Any) -> str:
    if raw:
        EtcdLocation.parse(str(raw))  # validates
    return str(raw)


def _mechanisms(raw: Any) -> str:
    mechanisms = [m.strip().upper() for m in str(raw).split(",") if m.strip()]
    unknown = set(mechanisms) - set(MECHANISMS)
    if unknown or not mechanisms:
        raise ValueError(f"mechanisms must be among {', '.join(MECHANISMS)}, got {raw!r}")
    return ",".join(mechanisms)


def _tables(raw: Any) -> list[dict[str, Any]]:
    """An array of tables in the file, or the same as JSON in a flag or the environment."""
    entries = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError("expected an array of tables")
    return entries


def _acls(raw: Any) -> tuple[Acl, ...]:
    try:
        return tuple(parse_acl(entry) for entry in _tables(raw))
    except AclError as e:
        raise ValueError(str(e)) from None


_QUOTA_APIS = {
    "allocate_producer_ids_quota": 67,
    "init_producer_id_quota": 22,
    "producer_ids_rate": NEW_PRODUCER_IDS,
}


def _quota_overrides(raw: Any) -> tuple[QuotaOverride, ...]:
    result = []
    for entry in _tables(raw):
        unknown = set(entry) - {"principal", "client_id", *_QUOTA_APIS}
        if unknown or not ({"principal", "client_id"} & set(entry)):
            raise ValueError(f"{entry}: needs principal and/or client_id, and known quotas only")
        if "producer_ids_rate" in entry and "principal" not in entry:
            raise ValueError(f"{entry}: producer_ids_rate is per principal: name one")
        for name, api_key in _QUOTA_APIS.items():
            if name in entry:
                rate = float(entry[name])
                if not rate >= 0:
                    raise ValueError(f"{entry}: {name} must be >= 0")
                result.append(
                    QuotaOverride(api_key, rate, entry.get("principal"), entry.get("client_id"))
                )
    return tuple(result)


@dataclass(frozen=True, slots=True)
class Settings:
    listen: HostPort = _setting(
        HostPort("127.0.0.1", 9093),
        "Kafka-protocol listener (HOST:PORT; port 0 picks one)",
        parse=_address,
    )
    listeners: str = _setting(
        "",
        "comma-separated PROTOCOL://HOST:PORT with PROTOCOL one of PLAINTEXT, SSL, "
        "SASL_PLAINTEXT, SASL_SSL; replaces `listen` when set; the first is advertised as "
        "advertised_listener, the others as this host's name when on a wildcard address",
        parse=_listeners,
    )
    advertised_listener: HostPort | None = _setting(
        None,
        "HOST:PORT given to clients in Metadata and FindCoordinator, which they reconnect "
        "to (default: the listen address; required when that is a wildcard, 0.0.0.0 or ::)",
        parse=_optional_address,
    )
    metrics_listen: HostPort = _setting(
        HostPort("127.0.0.1", 9464),
        "HTTP for /metrics, /healthz and /readyz (HOST:PORT)",
        parse=_address,
    )
    data_dir: Path = _setting(
        Path("pidctl-data"),
        "directory of the metadata log, made by `pidctl format` (serve refuses one that is not)",
        parse=_path,
    )
    node_id: int = _setting(1, "this controller's node id", parse=ANY_INTEGER)
    cluster_id: str | None = _setting(
        None,
        "format: the new cluster's id (default: a random one); serve: must be the stored "
        "one if set",
        parse=_optional_text,
    )
    first_producer_id: int = _setting(0, "lowest producer id this controller may grant")
    last_producer_id: int = _setting(
        INT64_MAX - 1, "highest producer id this controller may grant (inclusive)"
    )
    pid_source: str = _setting(
        "",
        "where PIDs come from: empty = this controller alone; etcd://HOST:PORT[,HOST:PORT...]"
        "/PREFIX (etcds:// for TLS) = leases from a counter in etcd shared by a fleet of "
        "controllers (docs/fleets.md)",
        parse=_pid_source,
    )
    pid_lease_size: int = _setting(
        DEFAULT_LEASE_SIZE,
        "PIDs taken from etcd per lease (a multiple of 1000)",
        "producer ids",
        parse=POSITIVE,
    )
    pid_lease_prefetch_ratio: float = _setting(
        DEFAULT_PREFETCH_RATIO,
        "take the next lease while less than this fraction of a lease is left (0 < r <= 1)",
        parse=_fraction,
    )
    producer_id_reservation: int = _setting(
        DEFAULT_RESERVATION_SIZE,
        "PIDs reserved ahead of the grants in the data dir's reservation file (one small "
        "atomic write per reservation); a start-up after a crash skips up to this many, "
        "since the log's tail may have lost grants below it (docs/log-format.md)",
        "producer ids",
        parse=POSITIVE,
    )
    etcd_timeout_ms: int = _setting(2000, "time allowed for one etcd request", "ms", parse=POSITIVE)
    etcd_cafile: str = _setting("", "PEM CA bundle etcd's certificate is checked against")
    etcd_certfile: str = _setting("", "PEM client certificate for etcd (client-cert auth)")
    etcd_keyfile: str = _setting("", "PEM private key of that certificate")
    etcd_username: str = _setting("", "etcd user (etcd's password authentication)")
    etcd_password: str = _setting("", "password of the etcd user", secret=True)
    ssl_certfile: str = _setting("", "PEM certificate (chain) of SSL and SASL_SSL listeners")
    ssl_keyfile: str = _setting("", "PEM private key of that certificate")
    ssl_keyfile_password: str = _setting("", "password of the private key", secret=True)
    ssl_cafile: str = _setting("", "PEM CA bundle that client certificates are checked against")
    ssl_client_auth: str = _setting(
        "none",
        "client certificates on SSL listeners: none, requested or required (Kafka's "
        "ssl.client.auth); the principal is User:<certificate subject>",
        parse=_choice("none", "requested", "required"),
    )
    sasl_enabled_mechanisms: str = _setting(
        "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "SASL mechanisms of SASL_* listeners",
        parse=_mechanisms,
    )
    credentials_file: str = _setting(
        "",
        "SCRAM credentials (salted, hashed) of SASL users; see `pidctl users`",
        reload=True,
    )
    authorizer: str = _setting(
        "none",
        "none (everyone may do everything) or acl (the acls below, deny by default)",
        parse=_choice("none", "acl"),
        reload=True,
    )
    super_users: str = _setting(
        "",
        "principals allowed everything, separated by ; as Kafka's super.users "
        "(User:CN=a,O=b;User:admin)",
        reload=True,
    )
    acls: tuple[Acl, ...] = _setting(
        (),
        "ACLs: an array of tables in the config file (principal, operation, resource_type, "
        "resource_name, pattern_type, permission, host), or JSON in PIDCTL_ACLS",
        parse=_acls,
        reload=True,
    )
    max_frame_bytes: int = _setting(
        DEFAULT_MAX_FRAME_BYTES,
        "largest request frame accepted; larger closes the connection",
        "bytes",
        parse=POSITIVE,
    )
    max_coordinator_keys: int = _setting(
        DEFAULT_MAX_COORDINATOR_KEYS,
        "keys one FindCoordinator (v4+) may ask for; more is answered INVALID_REQUEST in one entry",
        "keys",
        parse=POSITIVE,
    )
    max_metadata_topics: int = _setting(
        DEFAULT_MAX_METADATA_TOPICS,
        "topics one Metadata request may name; more is answered INVALID_REQUEST",
        "topics",
        parse=POSITIVE,
    )
    max_registration_entries: int = _setting(
        DEFAULT_MAX_REGISTRATION_ENTRIES,
        "listeners, features and log dirs (each) one BrokerRegistration may carry; more is "
        "answered INVALID_REQUEST",
        "entries",
        parse=POSITIVE,
    )
    max_entries_per_round: int = _setting(
        DEFAULT_MAX_ENTRIES_PER_ROUND,
        "work one connection may have decided before the other connections run, in entries "
        "(a FindCoordinator's keys, a Metadata's topics; a request without them counts 1); "
        "its further requests wait for its next round",
        "entries",
        parse=POSITIVE,
    )
    max_in_flight_per_connection: int = _setting(
        64,
        "requests per connection whose answers are not yet written before reading pauses",
        "requests",
        parse=POSITIVE,
    )
    max_unwritten_bytes_per_connection: int = _setting(
        DEFAULT_MAX_UNWRITTEN_BYTES,
        "bytes of answers one connection may have waiting for a client that does not read "
        "them; past it, reading pauses until they are written (Kafka mutes such a channel)",
        "bytes",
        parse=POSITIVE,
    )
    max_connections: int = _setting(
        10_000,
        "client connections open at once; more are closed at once",
        "connections",
        parse=POSITIVE,
    )
    # Prometheus and a container's probes open one connection at a time each, for
    # milliseconds: a few dozen leave room for several scrapers.
    metrics_max_connections: int = _setting(
        32,
        "connections to the metrics and health endpoint open at once (counted in the "
        "file-descriptor budget with max_connections); one more is accepted all the same, "
        "and the connection waiting longest for its request closed to make room, so that "
        "connections held open cannot keep /healthz and /readyz probes out",
        "connections",
        parse=POSITIVE,
    )
    # (transport/http.py's DEFAULT_REQUEST_TIMEOUT_S, which imports these settings.)
    metrics_request_timeout_ms: int = _setting(
        1000,
        "time a connection to the metrics and health endpoint may take to send its request "
        "head (Prometheus and container probes send it as they connect); it is closed after",
        "ms",
        parse=POSITIVE,
    )
    max_connections_per_address: int = _setting(
        1000,
        "connections open at once from one source address; more are closed at once",
        "connections",
        parse=POSITIVE,
    )
    connections_max_idle_ms: int = _setting(
        600_000,
        "a connection with no request for this long is closed (Kafka's connections.max.idle.ms)",
        "ms",
        parse=POSITIVE,
    )
    frame_timeout_ms: int = _setting(
        30_000,
        "time a client may take to send one whole request once it has begun "
        "(slowloris); the connection is closed after it",
        "ms",
        parse=POSITIVE,
    )
    broker_session_timeout_ms: int = _setting(
        DEFAULT_SESSION_TIMEOUT_MS,
        "a broker not heard from for this long is fenced",
        "ms",
        parse=POSITIVE,
    )
    transaction_max_timeout_ms: int = _setting(
        DEFAULT_MAX_TRANSACTION_TIMEOUT_MS,
        "largest transaction timeout InitProducerId accepts (Kafka's transaction.max.timeout.ms)",
        "ms",
        parse=POSITIVE,
    )
    transactional_id_expiration_ms: int = _setting(
        DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS,
        "a transactional id unused this long expires (Kafka's transactional.id.expiration.ms)",
        "ms",
        parse=POSITIVE,
    )
    transactional_id_cleanup_interval_ms: int = _setting(
        3_600_000,
        "how often expired transactional ids are removed (Kafka's "
        "transaction.remove.expired.transaction.cleanup.interval.ms)",
        "ms",
        parse=POSITIVE,
    )
    transactional_id_expiry_batch: int = _setting(
        DEFAULT_EXPIRY_BATCH,
        "transactional ids expired in one step; the next step waits until it is durable, "
        "other requests served between (a cleanup costs what expires, not what is held)",
        "ids",
        parse=POSITIVE,
    )
    job_allocation_reuse_ms: int = _setting(
        DEFAULT_JOB_REUSE_MS,
        "a re-run of a named job version (txnAppId/txnVersion, a stream's batch) gets its "
        "blocks back for this long after its first block, and is refused "
        "UNKNOWN_PRODUCER_ID after: at most the brokers' producer.id.expiration.ms",
        "ms",
        parse=POSITIVE,
    )
    job_allocation_expiration_ms: int = _setting(
        DEFAULT_JOB_EXPIRATION_MS,
        "a job app id whose latest version is this old in the controller's running time (the "
        "time it was down does not count) is forgotten (with a logged record, by the "
        "transactional-id cleanup, in steps of transactional_id_expiry_batch); at least "
        "job_allocation_reuse_ms",
        "ms",
        parse=POSITIVE,
    )
    max_job_app_id_bytes: int = _setting(
        DEFAULT_MAX_JOB_APP_ID_BYTES,
        "longest app id a named job may have (txnAppId, a stream's query id), in UTF-8; "
        "longer is refused INVALID_REQUEST and nothing is recorded",
        "bytes",
        parse=POSITIVE,
    )
    max_job_app_ids_per_principal: int = _setting(
        DEFAULT_MAX_JOB_APP_IDS_PER_PRINCIPAL,
        "app ids one principal may own at once (each until it expires); a new one past it is "
        "refused POLICY_VIOLATION and nothing is recorded",
        "app ids",
        parse=POSITIVE,
    )
    allocate_producer_ids_quota: float = _setting(
        0.0,
        "AllocateProducerIds per second per (principal, client id; a job's per principal) "
        "before responses carry throttle_time_ms and the connection is muted for it; one "
        "that comes while the quota is still behind (another connection, a client that "
        "ignored the throttle) is refused THROTTLING_QUOTA_EXCEEDED; 0: no quota",
        "requests/s",
    )
    init_producer_id_quota: float = _setting(
        0.0,
        "InitProducerId per second per (principal, client id), as allocate_producer_ids_quota "
        "(refused COORDINATOR_LOAD_IN_PROGRESS, which clients retry); 0: no quota",
        "requests/s",
    )
    producer_ids_rate: float = _setting(
        0.0,
        "new producer ids per second per principal, whatever its connections and client ids "
        "(idempotent InitProducerIds, a transactional id's first use or rotation to a new "
        "PID, and a job's new block, 1,000: KIP-936's quota, which Kafka never shipped); past "
        "it, answers carry throttle_time_ms and the connection is muted for it, and a "
        "request that may create producer ids while the principal is still behind is "
        "refused (InitProducerId COORDINATOR_LOAD_IN_PROGRESS, AllocateProducerIds "
        "THROTTLING_QUOTA_EXCEEDED); 0: no quota",
        "producer ids/s",
    )
    connection_creation_rate: float = _setting(
        0.0,
        "new connections per second per source address; more are accepted only after a delay "
        "(Kafka's max.connection.creation.rate); 0: no limit",
        "connections/s",
    )
    quota_overrides: tuple[QuotaOverride, ...] = _setting(
        (),
        "rates for given principals and/or client ids: an array of tables in the config "
        "file with principal and/or client_id, and allocate_producer_ids_quota and/or "
        "init_producer_id_quota, or with principal and producer_ids_rate; the most specific "
        "applies, as in Kafka",
        parse=_quota_overrides,
    )
    quota_window_ms: int = _setting(
        1000, "burst allowance of every rate above: rate x window", "ms", parse=POSITIVE
    )
    quota_max_buckets: int = _setting(
        DEFAULT_MAX_BUCKETS,
        "request-quota buckets (one per API, principal and client id) and connection-rate "
        "buckets (one per source address) kept, each table; each is a few hundred bytes "
        "whatever the client id (its hash is kept). When a table is full, a bucket full "
        "again makes room; else a new client id counts in its principal's overflow bucket "
        "(a new address in one shared by all such addresses)",
        "buckets",
        parse=POSITIVE,
    )
    segment_max_bytes: int = _setting(
        DEFAULT_SEGMENT_MAX_BYTES,
        "roll to a new log segment past this size",
        "bytes",
        parse=POSITIVE,
    )
    snapshot_interval_records: int = _setting(
        DEFAULT_SNAPSHOT_INTERVAL_RECORDS,
        "write a snapshot after this many records, once the log has also grown by the last "
        "snapshot's size (a large state is not rewritten every 10,000 records), and at "
        "most once per snapshot_min_interval_ms",
        "records",
        parse=POSITIVE,
    )
    snapshot_min_interval_ms: int = _setting(
        round(DEFAULT_SNAPSHOT_MIN_INTERVAL_S * 1000),
        "at most one snapshot this often, however fast records come (each rolls the segment "
        "and writes a file: once a second under load, that raised durable requests' p99 by "
        "half a millisecond); start-up replays at most this long's records, or "
        "snapshot_interval_records if more; 0: no limit",
        "ms",
        parse=NON_NEGATIVE,
    )
    log_inline_sync_max_ms: int = _setting(
        round(DEFAULT_INLINE_SYNC_MAX_S * 1000),
        "a group commit's write and fdatasync run on the event loop while they take less "
        "than this, and in the log's own thread after a slower one (until 64 in a row there "
        "are quick; twice as many after each slow one soon after coming back), so a slow "
        "disk does not hold up what does not wait for it; 0: always in the thread. A "
        "commit nobody waits for (a prefetched block's grant) always runs in the thread",
        "ms",
    )
    data_dir_min_free_bytes: int = _setting(
        DEFAULT_MIN_FREE_BYTES,
        "free space the data dir's filesystem must have: below it `pidctl serve` refuses to "
        "start, and a running server (checked every second) pauses grants, before a commit "
        "meets ENOSPC: InitProducerId is answered COORDINATOR_LOAD_IN_PROGRESS and "
        "AllocateProducerIds KAFKA_STORAGE_ERROR (both retriable), /readyz fails and the log "
        "says so, until there is room again; 0: not checked",
        "bytes",
        parse=NON_NEGATIVE,
    )
    log_preallocate_bytes: int = _setting(
        DEFAULT_PREALLOCATE_BYTES,
        "zeros written ahead of the records in the active segment, this many at a time in a "
        "worker thread once less than half is left, so that a commit's fdatasync overwrites "
        "blocks already on disk and writes no metadata (on the development machine a "
        "commit's sync took 1.4-1.5 times as long appending); readers stop at the zeros, "
        "a clean stop and a start-up give them back; whole 64 KiB chunks (rounded down), at "
        "least one; 0: append instead",
        "bytes",
        parse=_zero_or_between(MIN_PREALLOCATE_BYTES, MAX_PREALLOCATE_BYTES),
    )
    # Kafka keeps its metadata log after snapshots up to metadata.max.retention.bytes
    # (100 MiB) and .ms (7 days); the same defaults keep weeks of grants here (a grant
    # record is ~100 bytes).
    log_retention_bytes: int = _setting(
        DEFAULT_RETENTION_BYTES,
        "segments already covered by a snapshot (the audit trail of `pidctl log dump`) older "
        "than log_retention_ms are kept while the trail is within this size, the oldest "
        "deleted first; it never cuts into log_retention_ms (a trail above it within that "
        "time is logged and shown as pidctl_audit_trail_floor_bytes); 0: none older",
        "bytes",
        parse=NON_NEGATIVE,
    )
    log_retention_ms: int = _setting(
        DEFAULT_RETENTION_MS,
        "segments already covered by a snapshot (the audit trail of `pidctl log dump`) are "
        "kept at least this long after their last write, whatever log_retention_bytes says "
        "(checked at each snapshot); 0: no floor",
        "ms",
        parse=NON_NEGATIVE,
    )
    reload_timeout_ms: int = _setting(
        5000,
        "on SIGHUP, time allowed to read the config and credentials files (in a worker "
        "thread: a file on a hung mount never holds up requests); a reload past it fails, "
        "and the next one waits until that read has returned",
        "ms",
        parse=POSITIVE,
    )
    shutdown_grace_ms: int = _setting(
        5000, "on SIGTERM/SIGINT, time allowed for in-flight requests to finish", "ms"
    )
    log_format: str = _setting(
        "auto",
        "log output: auto (console on a terminal, json otherwise), json (one object per "
        "line) or console (readable, coloured on a terminal)",
        parse=_choice("auto", "json", "console"),
    )
    log_level: str = _setting(
        "info", "debug, info, warning or error", parse=_choice("debug", "info", "warning", "error")
    )

    @property
    def advertised(self) -> HostPort:
        return self.advertised_listener or self.listen

    @property
    def listener_list(self) -> list[tuple[str, HostPort]]:
        """(security protocol, address) of every listener."""
        if self.listeners:
            return parse_listeners(self.listeners)
        return [("PLAINTEXT", self.listen)]

    @property
    def etcd_location(self) -> EtcdLocation | None:
        return EtcdLocation.parse(self.pid_source) if self.pid_source else None

    @property
    def pid_range(self) -> ProducerIdRange:
        leased = bool(self.pid_source)
        return ProducerIdRange(self.first_producer_id, self.last_producer_id, leased)


SETTING_NAMES = tuple(f.name for f in dataclasses.fields(Settings))
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}


def _convert(name: str, raw: Any) -> Any:
    """Turn a raw value (string from env/flag, or TOML value) into the setting's type."""
    return _FIELDS[name].metadata["parse"](raw)


def parse_listeners(text: str) -> list[tuple[str, HostPort]]:
    """Listeners named by their security protocol (``SASL_SSL://host:9094``)."""
    result = []
    for protocol, address in addresses.parse_listeners(text):
        if protocol.upper() not in PROTOCOLS:
            raise ValueError(
                f"listener {protocol}://{address} is not PROTOCOL://HOST:PORT with PROTOCOL "
                f"one of {', '.join(PROTOCOLS)}"
            )
        result.append((protocol.upper(), address))
    return result


def _check_together(settings: Settings) -> list[str]:
    """Problems that involve several settings at once."""
    problems = []
    protocols = {protocol for protocol, _ in settings.listener_list}
    if protocols & {"SSL", "SASL_SSL"} and not (settings.ssl_certfile and settings.ssl_keyfile):
        problems.append("ssl_certfile and ssl_keyfile: required by SSL and SASL_SSL listeners")
    if settings.ssl_client_auth != "none" and not settings.ssl_cafile:
        problems.append("ssl_cafile: required to check client certificates (ssl_client_auth)")
    if protocols & {"SASL_PLAINTEXT", "SASL_SSL"} and not settings.credentials_file:
        problems.append("credentials_file: required by SASL listeners (see `pidctl users add`)")
    for name in ("ssl_certfile", "ssl_keyfile", "ssl_cafile"):
        path = getattr(settings, name)
        if path and not Path(path).is_file():
            problems.append(f"{name}: no such file {path!r}")
    if settings.pid_source:
        if (settings.first_producer_id, settings.last_producer_id) != (0, INT64_MAX - 1):
            problems.append(
                "first_producer_id/last_producer_id: cannot be combined with pid_source "
                "(the fleet's leases divide the space)"
            )
        if settings.pid_lease_size % BLOCK_SIZE:
            problems.append(f"pid_lease_size: must be a multiple of {BLOCK_SIZE}")
    if bool(settings.etcd_certfile) != bool(settings.etcd_keyfile):
        problems.append("etcd_certfile and etcd_keyfile: give both or neither")
    for name in ("etcd_cafile", "etcd_certfile", "etcd_keyfile"):
        path = getattr(settings, name)
        if path and not Path(path).is_file():
            problems.append(f"{name}: no such file {path!r}")
    if settings.job_allocation_expiration_ms < settings.job_allocation_reuse_ms:
        problems.append(
            "job_allocation_expiration_ms: must be at least job_allocation_reuse_ms (a job "
            "version is forgotten only once it can no longer be re-run)"
        )
    try:
        settings.pid_range  # noqa: B018 - validates first/last together
    except ValueError as e:
        problems.append(f"first_producer_id/last_producer_id: {e}")
    return problems


#: A key no setting has, appended to a config file to see where its last line belongs.
_PROBE_KEY = "pidctl_end_of_file_probe"


def ends_inside_acl_table(text: str) -> bool:
    """Whether a config file (that parses) ends inside an ``[[acls]]`` table: what follows
    its last line would belong to its last ACL. A file cut while it was being written can
    end so anywhere in its ACLs, and parse: an ACL cut before its ``host`` or
    ``permission`` line reads as one for every host, or as an ALLOW; one cut off whole
    loses a DENY a later line held. An ``acls = [...]`` array cannot be cut and parse."""
    probed = tomllib.loads(f"{text}\n{_PROBE_KEY} = 1\n")
    acls = probed.get("acls")
    return isinstance(acls, list) and bool(acls) and _PROBE_KEY in acls[-1]


#: Hosts that bind every interface: a listener may listen on one, but no client can
#: connect to it.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})


def check_advertised(settings: Settings) -> None:
    """``pidctl serve``'s check that clients are told an address they can connect to: Kafka
    clients drop the bootstrap connection and reconnect to the address Metadata and
    FindCoordinator give, so a first listener on a wildcard address needs an
    ``advertised_listener``, as Kafka refuses to advertise 0.0.0.0. (Without one pidctl
    would advertise this host's name, which a client outside a container cannot reach.)
    Raises :class:`SettingsError` (exit 2) saying so."""
    _, first = settings.listener_list[0]
    if settings.advertised_listener is None and first.host in WILDCARD_HOSTS:
        raise SettingsError(
            f"advertised_listener: required when listening on the wildcard address {first} "
            "(clients reconnect to the address pidctl advertises, and cannot connect to "
            f"{first.host}): set --advertised-listener or PIDCTL_ADVERTISED_LISTENER to the "
            "HOST:PORT clients reach, or listen on that host"
        )


def load_settings_with_sources(
    flags: Mapping[str, Any],
    environ: Mapping[str, str] = os.environ,
    config_file: Path | None = None,
    *,
    for_reload: bool = False,
) -> tuple[Settings, dict[str, str]]:
    """Merge file < env < flags over the defaults; return the settings and where each
    non-default value came from. Raises :class:`SettingsError` listing every problem, one
    line each; ``for_reload`` (a SIGHUP), :class:`ReloadRefused` for a config file that
    ends inside an ``[[acls]]`` table (:func:`ends_inside_acl_table`)."""
    merged: dict[str, tuple[str, Any]] = {}
    text = ""
    if config_file is not None:
        try:
            with open(config_file, "rb") as f:
                text = f.read().decode()  # (one read: a rename into place is seen whole)
            data = tomllib.loads(text)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise SettingsError(f"config file {config_file}: {e}") from e
        for name, value in data.items():
            merged[name.replace("-", "_")] = (f"{config_file}: {name}", value)
    ignored = set(service_link_variables(environ))
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX) and key != ENV_PREFIX + "CONFIG" and key not in ignored:
            merged[key[len(ENV_PREFIX) :].lower()] = (key, value)
    for name, value in flags.items():
        if value is not None:
            merged[name] = ("--" + name.replace("_", "-"), value)
    values: dict[str, Any] = {}
    problems: list[str] = []
    for name, (source, raw) in merged.items():
        if name not in SETTING_NAMES:
            problems.append(f"{source}: unknown setting {name!r}")
            continue
        try:
            values[name] = _convert(name, raw)
        except ValueError as e:
            problems.append(f"{source}: invalid {name}: {e}")
    if problems:
        raise SettingsError("\n".join(problems))
    settings = Settings(**values)
    problems = _check_together(settings)
    if problems:
        raise SettingsError("\n".join(problems))
    # (After the checks: a file with a malformed setting is refused for what is wrong.)
    if for_reload and config_file is not None and ends_inside_acl_table(text):
        raise ReloadRefused(
            f"config file {config_file} ends inside an [[acls]] table, as one cut while "
            "it was being written would (a half-written ACL can allow more than the "
            "whole file); write the ACLs as one array, acls = [{...}, ...], which a cut "
            "leaves unreadable, or restart the server to take this file"
        )
    return settings, {name: source for name, (source, _) in merged.items()}


def show_settings(settings: Settings, sources: Mapping[str, str]) -> list[str]:
    """The effective settings as a TOML file that loads back as the same settings, each line
    saying where its value came from. Secrets are never shown: a set one is a comment (fed
    back, it is unset). Unset settings are comments too; ``acls`` is one array of inline
    tables, an ACL a line (a reload takes it: :func:`ends_inside_acl_table`), and the
    arrays of tables (``quota_overrides``) come last, as TOML wants."""
    lines: list[str] = []
    arrays: list[str] = []
    tables: list[str] = []
    for f in dataclasses.fields(Settings):
        value = getattr(settings, f.name)
        source = sources.get(f.name, "default")
        if f.metadata["secret"]:
            lines.append(f"# {f.name} = ({'set, not shown' if value else 'unset'})  # {source}")
        elif value is None or value == "" or value == ():
            lines.append(f"# {f.name} = (unset)  # {source}")
        elif isinstance(value, tuple) and f.name == "acls":
            arrays += [f"# {f.name}: {source}", f"{f.name} = ["]
            for row in _table_rows(value):
                pairs = ", ".join(f"{key} = {_toml_value(item)}" for key, item in row.items())
                arrays.append(f"  {{ {pairs} }},")
            arrays.append("]")
        elif isinstance(value, tuple):
            tables += ["", f"# {f.name}: {source}"]
            for row in _table_rows(value):
                tables.append(f"[[{f.name}]]")
                tables += [f"{key} = {_toml_value(item)}" for key, item in row.items()]
        else:
            lines.append(f"{f.name} = {_toml_value(value)}  # {source}")
    return lines + arrays + tables


def _toml_value(value: Any) -> str:
    """A TOML literal: numbers as they are, everything else as a string (JSON's escapes are
    TOML's)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)


def _table_rows(items: tuple[Any, ...]) -> list[dict[str, Any]]:
    """The config-file tables that parse back into ``items`` (ACLs, quota overrides)."""
    names = {api_key: name for name, api_key in _QUOTA_APIS.items()}
    rows = []
    for item in items:
        if isinstance(item, QuotaOverride):
            who = {"principal": item.principal, "client_id": item.client_id}
            row: dict[str, Any] = {key: value for key, value in who.items() if value is not None}
            row[names[item.api_key]] = item.rate
            rows.append(row)
        else:
            rows.append(dataclasses.asdict(item))
    return rows


class SettingDoc(NamedTuple):
    """What --help and docs/configuration.md say of one setting."""

    name: str
    default: str
    unit: str
    doc: str
    secret: bool
    reloadable: bool


def describe_settings() -> list[SettingDoc]:
    """Every setting in the order ``Settings`` declares them, for --help and the docs."""
    return [
        SettingDoc(
            f.name,
            "" if f.default is None else str(f.default),
            f.metadata["unit"],
            f.metadata["doc"],
            f.metadata["secret"],
            f.metadata["reload"],
        )
        for f in dataclasses.fields(Settings)
    ]


#: The settings a running server takes anew on SIGHUP; the others take a restart.
RELOADABLE_SETTINGS = frozenset(d.name for d in describe_settings() if d.reloadable)
