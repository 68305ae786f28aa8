"""The controller: one handler per API, turning a decoded request into records and a response.

No I/O here. ``handle`` decides, appends the records to the log's buffer (which never
waits), replays them onto the in-memory state at once so the next decision sees them, and
says which offset must be durable before the response may be sent. Decisions run one at a
time on the event loop, so the logic needs no locks.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from protocol.api_versions import build_api_versions_response, has_valid_client_software
from protocol.apis import ApiKey, SupportedApis, response_class, supported_apis
from protocol.codec import Request

from . import brokers, producer_ids, transactions
from .acl import CLUSTER, Authorizer
from .brokers import BrokerSessions
from .pid_pool import ProducerIdPool
from .producer_ids import ProducerIdRange
from .records import ProducerIdsGranted, Record, TransactionalIdExpired
from .state import ControllerState

#: Versions served, per API: what Kafka 4.x serves, as far as kio has the schemas.
#: InitProducerId stops at v5: v6 is KIP-939's two-phase commit, which pidctl does not do.
SERVED_APIS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.METADATA: (0, 13),
    ApiKey.FIND_COORDINATOR: (0, 6),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.DESCRIBE_CLUSTER: (0, 2),
    # Answered by the connection (controller/sasl_session.py), not by the controller.
    # SaslHandshake v0 (raw tokens after it) is gone from Kafka 4.0, and from pidctl.
    ApiKey.SASL_HANDSHAKE: (1, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.BROKER_REGISTRATION: (0, 4),
    ApiKey.BROKER_HEARTBEAT: (0, 2),
    ApiKey.UNREGISTER_BROKER: (0, 0),
    ApiKey.ALLOCATE_PRODUCER_IDS: (0, 0),
}

NO_WAIT = -1

#: FindCoordinator key types Kafka defines: group, transaction, share group.
_COORDINATOR_KEY_TYPES = (0, 1, 2)


class RecordSink(Protocol):
    """Where records go to become durable (the metadata log)."""

    def append(self, record: Record, timestamp_ms: int) -> int: ...


@dataclass(frozen=True, slots=True)
class Now:
    """Wall-clock time for records, monotonic time for sessions; both in milliseconds."""

    wall_ms: int
    mono_ms: int


@dataclass(frozen=True, slots=True)
class Reply:
    """A response, and the log offset that must be durable before it is sent."""

    body: Any
    durable_offset: int = NO_WAIT


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who is asking, and through which listener: the principal is recorded in grants (the
    audit trail) and authorised; Metadata and FindCoordinator answer with the listener's
    advertised address."""

    principal: str = "User:ANONYMOUS"
    peer: str = ""
    host: str = "*"
    advertised_host: str | None = None
    advertised_port: int | None = None


Handler = Callable[["Controller", Request, Now, ConnectionInfo], Reply]


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    """The settings the decisions depend on."""

    node_id: int = 1
    advertised_host: str = "127.0.0.1"
    advertised_port: int = 9093
    pid_range: ProducerIdRange = field(default_factory=ProducerIdRange)
    max_transaction_timeout_ms: int = transactions.DEFAULT_MAX_TRANSACTION_TIMEOUT_MS
    transactional_id_expiration_ms: int = transactions.DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS


class Controller:
    """Turns requests into records and responses against one :class:`ControllerState`."""

    def __init__(
        self,
        state: ControllerState,
        sink: RecordSink,
        *,
        config: ControllerConfig | None = None,
        sessions: BrokerSessions | None = None,
        on_grant: Callable[[ProducerIdsGranted], None] | None = None,
        authorizer: Authorizer | None = None,
    ) -> None:
        self.state = state
        self.authorizer = authorizer or Authorizer()
        self.sink = sink
        self.config = config or ControllerConfig()
        self.pid_range = self.config.pid_range
        self.sessions = sessions or BrokerSessions()
        self.on_grant = on_grant
        self.pool = ProducerIdPool()
        self.supported: SupportedApis = supported_apis(SERVED_APIS)
        self._handlers: dict[int, Handler] = {
            ApiKey.API_VERSIONS: Controller._api_versions,
            ApiKey.BROKER_REGISTRATION: Controller._broker_registration,
            ApiKey.BROKER_HEARTBEAT: Controller._broker_heartbeat,
            ApiKey.UNREGISTER_BROKER: Controller._unregister_broker,
            ApiKey.ALLOCATE_PRODUCER_IDS: Controller._allocate_producer_ids,
            ApiKey.METADATA: Controller._metadata,
            ApiKey.FIND_COORDINATOR: Controller._find_coordinator,
            ApiKey.INIT_PRODUCER_ID: Controller._init_producer_id,
            ApiKey.DESCRIBE_CLUSTER: Controller._describe_cluster,
        }

    def handle(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        """Decide one request. The caller sends ``reply.body`` once ``durable_offset`` is."""
        return self._handlers[request.api_key](self, request, now, conn)

    def commit(self, records: list[Record], now: Now) -> int:
        """Apply records to the state and append them; return the offset to wait for."""
        for record in records:
            self._commit_one(record, now)
        # Wait for everything decided so far, not just our records: a response may report
        # state (a retried registration's epoch) that an earlier, still pending record made.
        return self.state.next_offset - 1

    def _may(self, conn: ConnectionInfo, operation: str, resource_type: str = "Cluster",
             name: str = CLUSTER) -> bool:  # fmt: skip
        return self.authorizer.authorize(conn.principal, operation, resource_type, name, conn.host)

    def _advertised(self, conn: ConnectionInfo) -> tuple[str, int]:
        if conn.advertised_host is not None and conn.advertised_port is not None:
            return conn.advertised_host, conn.advertised_port
        return self.config.advertised_host, self.config.advertised_port

    def _commit_one(self, record: Record, now: Now) -> int:
        # Replay first: it checks every invariant before it changes anything, so a record
        # that would corrupt the log is refused (the request fails) before it is appended.
        offset = self.state.next_offset
        self.state.replay(offset, record)
        appended = self.sink.append(record, now.wall_ms)
        if appended != offset:
            raise AssertionError(f"log offset {appended} != state offset {offset}")
        if isinstance(record, ProducerIdsGranted) and self.on_grant is not None:
            self.on_grant(record)
        return offset

    def snapshot(self) -> Callable[[], dict[str, Any]]:
        """What the log needs for a snapshot at this instant: taken at once, built later."""
        return self.state.copy().to_snapshot

    def expire_transactional_ids(self, now: Now) -> int:
        """Log an expiry for every transactional id unused past the setting; return how many."""
        expired = transactions.expired(
            self.state.transactional_ids, now.wall_ms, self.config.transactional_id_expiration_ms
        )
        self.commit([TransactionalIdExpired(tid, pid) for tid, pid in expired], now)
        return len(expired)

    def _next_pool_producer_id(self, now: Now) -> tuple[int, int] | None:
        """A PID from the controller's own pool (and the grant offset to wait for), topping
        the pool up through the same grant path as a broker's AllocateProducerIds."""
        if self.pool.wants_block():
            allocation = producer_ids.grant(
                self.state, self.pid_range, holder_id=self.config.node_id
            )
            if allocation.record is not None:
                offset = self._commit_one(allocation.record, now)
                self.pool.add_block(
                    allocation.record.first_producer_id, allocation.record.next_producer_id, offset
                )
        return self.pool.take()

    # -- handlers ---------------------------------------------------------------------------

    def _api_versions(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        version = request.api_version
        if not has_valid_client_software(request.body):
            body = build_api_versions_response(version, self.supported, ErrorCode.invalid_request)
        else:
            body = build_api_versions_response(version, self.supported)
        return Reply(body)

    def _broker_registration(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        body = request.body
        listeners = tuple(f"{lst.name}://{lst.host}:{lst.port}" for lst in body.listeners)
        if not self._may(conn, "ClusterAction"):
            decision = brokers.Decision(ErrorCode.cluster_authorization_failed)
        elif body.incarnation_id is None:
            decision = brokers.Decision(ErrorCode.invalid_request)
        else:
            decision = brokers.register(
                self.state,
                self.sessions,
                broker_id=body.broker_id,
                cluster_id=body.cluster_id,
                incarnation_id=str(body.incarnation_id),
                rack=body.rack,
                listeners=listeners,
                now_ms=now.mono_ms,
            )
        offset = self.commit(decision.records, now)
        response = _response(
            request, error_code=decision.error, broker_epoch=i64(decision.broker_epoch)
        )
        return Reply(response, offset)

    def _broker_heartbeat(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        body = request.body
        if not self._may(conn, "ClusterAction"):
            return Reply(_response(request, error_code=ErrorCode.cluster_authorization_failed,
                                   should_shut_down=False))  # fmt: skip
        decision = brokers.heartbeat(
            self.state,
            self.sessions,
            broker_id=body.broker_id,
            broker_epoch=body.broker_epoch,
            want_fence=body.want_fence,
            want_shut_down=body.want_shut_down,
            now_ms=now.mono_ms,
        )
        response = _response(
            request,
            error_code=decision.error,
            is_caught_up=decision.error == ErrorCode.none,
            is_fenced=decision.is_fenced,
            should_shut_down=decision.should_shut_down,
        )
        return Reply(response, self.commit(decision.records, now))

    def _unregister_broker(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        if not self._may(conn, "Alter"):  # Kafka: Alter on the cluster for this one
            return Reply(_response(request, error_code=ErrorCode.cluster_authorization_failed,
                                   error_message="Alter on the cluster is needed"))  # fmt: skip
        decision = brokers.unregister(self.state, self.sessions, broker_id=request.body.broker_id)
        offset = self.commit(decision.records, now)
        message = None if decision.error == ErrorCode.none else "broker is not registered"
        return Reply(_response(request, error_code=decision.error, error_message=message), offset)

    def _allocate_producer_ids(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        body = request.body
        client_id = request.header.client_id
        # A job (BrokerId -1, BrokerEpoch -1) is a producer that hands PIDs to its own
        # tasks: it needs what InitProducerId needs, not the brokers' ClusterAction.
        job = (body.broker_id, body.broker_epoch) == (
            producer_ids.JOB_BROKER_ID, producer_ids.JOB_BROKER_EPOCH)  # fmt: skip
        if not self._may(conn, "IdempotentWrite" if job else "ClusterAction"):
            allocation = producer_ids.Allocation(ErrorCode.cluster_authorization_failed)
        elif job:
            allocation = producer_ids.grant_job(
                self.state, self.pid_range, principal=conn.principal, client_id=client_id
            )
        else:
            allocation = producer_ids.allocate(
                self.state,
                self.pid_range,
                broker_id=body.broker_id,
                broker_epoch=body.broker_epoch,
                principal=conn.principal,
                client_id=client_id,
            )
        records: list[Record] = [allocation.record] if allocation.record else []
        offset = self.commit(records, now)
        response = _response(
            request,
            error_code=allocation.error,
            producer_id_start=i64(allocation.first_producer_id),
            producer_id_len=i32(allocation.length),
        )
        return Reply(response, offset)

    def _metadata(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        """This node is the only broker and the controller; it hosts no topics."""
        version, cls = request.api_version, response_class(request.api_key, request.api_version)
        entities = sys.modules[cls.__module__]
        host, port = self._advertised(conn)
        broker = _build(
            entities.MetadataResponseBroker,
            node_id=i32(self.config.node_id),
            host=host,
            port=i32(port),
            rack=None,
        )
        asked = request.body.topics
        topics = []
        for topic in asked or ():
            # v10+ may name a topic by id only: Kafka answers UNKNOWN_TOPIC_ID for those.
            error = ErrorCode.unknown_topic_or_partition
            if topic.name is None and version >= 10:
                error = ErrorCode.unknown_topic_id
            topics.append(
                _build(
                    entities.MetadataResponseTopic,
                    error_code=error,
                    name=topic.name,
                    topic_id=getattr(topic, "topic_id", None),
                    is_internal=False,
                    partitions=(),
                )
            )
        body = _build(
            cls,
            throttle_time=_NO_THROTTLE,
            brokers=(broker,),
            cluster_id=self.state.cluster_id,
            controller_id=i32(self.config.node_id),
            topics=tuple(topics),
            error_code=ErrorCode.none,  # v13+ (KIP-1102): a top-level error
        )
        return Reply(body)

    def _describe_cluster(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        """The brokers registered with this controller (endpoint type 1), or this controller
        itself (type 2, KIP-919). Fenced brokers are listed from v2 only if asked for."""
        body, cls = request.body, response_class(request.api_key, request.api_version)
        entry = sys.modules[cls.__module__].DescribeClusterBroker
        endpoint_type = getattr(body, "endpoint_type", 1)
        if not self._may(conn, "Describe"):
            return Reply(_build(
                cls, throttle_time=_NO_THROTTLE, error_code=ErrorCode.cluster_authorization_failed,
                error_message=None, endpoint_type=endpoint_type, cluster_id="",
                controller_id=i32(-1), brokers=(), cluster_authorized_operations=i32(-(2**31)),
            ))  # fmt: skip
        advertised_host, advertised_port = self._advertised(conn)
        include_fenced = getattr(body, "include_fenced_brokers", False)
        listed = []
        if endpoint_type == 2:
            listed.append(_build(
                entry, broker_id=i32(self.config.node_id), host=advertised_host,
                port=i32(advertised_port), rack=None, is_fenced=False,
            ))  # fmt: skip
        elif endpoint_type == 1:
            for registration in sorted(self.state.brokers.values(), key=lambda b: b.broker_id):
                fenced = self.sessions.is_fenced(registration.broker_id, now.mono_ms)
                if fenced and not include_fenced and request.api_version >= 2:
                    continue
                host, port = _first_listener(registration.listeners)
                listed.append(_build(
                    entry, broker_id=i32(registration.broker_id), host=host, port=i32(port),
                    rack=registration.rack, is_fenced=fenced,
                ))  # fmt: skip
        error = ErrorCode.none if endpoint_type in (1, 2) else ErrorCode.unsupported_endpoint_type
        response = _build(
            cls, throttle_time=_NO_THROTTLE, error_code=error,
            error_message=None if not error else f"unknown endpoint type {endpoint_type}",
            endpoint_type=endpoint_type, cluster_id=self.state.cluster_id or "",
            controller_id=i32(self.config.node_id), brokers=tuple(listed),
            cluster_authorized_operations=i32(-(2**31)),
        )  # fmt: skip
        return Reply(response)

    def _find_coordinator(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        """This node coordinates every group and transactional id."""
        body, version = request.body, request.api_version
        cls = response_class(request.api_key, version)
        key_type = getattr(body, "key_type", 0)
        host, port = self._advertised(conn)

        def answer(key: str) -> dict[str, Any]:
            error, message = ErrorCode.none, None
            if key_type not in _COORDINATOR_KEY_TYPES:
                error, message = ErrorCode.invalid_request, f"unknown key type {key_type}"
            elif key_type == 1 and not self._may(conn, "Describe", "TransactionalId", key):
                error = ErrorCode.transactional_id_authorization_failed
            elif key_type != 1 and not self._may(conn, "Describe", "Group", key):
                error = ErrorCode.group_authorization_failed
            if error:
                return {"error_code": error, "error_message": message, "node_id": i32(-1),
                        "host": "", "port": i32(-1)}  # fmt: skip
            node = i32(self.config.node_id)
            return {"error_code": error, "error_message": None, "node_id": node,
                    "host": host, "port": i32(port)}  # fmt: skip

        if version >= 4:
            entry = sys.modules[cls.__module__].Coordinator
            coordinators = tuple(entry(key=key, **answer(key)) for key in body.coordinator_keys)
            return Reply(_build(cls, throttle_time=_NO_THROTTLE, coordinators=coordinators))
        return Reply(_build(cls, throttle_time=_NO_THROTTLE, **answer(body.key)))

    def _init_producer_id(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        body, version = request.body, request.api_version
        expected: Any = transactions.parse_expected(
            getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1)
        )
        transactional_id = body.transactional_id
        timeout_ms = int(body.transaction_timeout / datetime.timedelta(milliseconds=1))
        if transactional_id is not None:
            if not self._may(conn, "Write", "TransactionalId", transactional_id):
                return self._init_reply(request, ErrorCode.transactional_id_authorization_failed)
        elif not self._may(conn, "IdempotentWrite"):
            return self._init_reply(request, ErrorCode.cluster_authorization_failed)
        if isinstance(expected, ErrorCode):
            return self._init_reply(request, expected)
        if transactional_id is None:
            # Idempotent producer: a fresh PID with epoch 0, nothing persisted but the block.
            # The timeout is not looked at (clients send -1, 0, 60000 or 2^31-1).
            taken = self._next_pool_producer_id(now)
            if taken is None:
                # Never 15/16 here: kafka-python would then look for a coordinator.
                return self._init_reply(request, ErrorCode.coordinator_load_in_progress)
            pid, grant_offset = taken
            return self._init_reply(request, ErrorCode.none, pid, 0, grant_offset)
        if transactional_id == "":
            return self._init_reply(request, ErrorCode.invalid_request)
        if not 0 < timeout_ms <= self.config.max_transaction_timeout_ms:
            return self._init_reply(request, ErrorCode.invalid_transaction_timeout)

        def new_producer_id() -> int | None:
            taken = self._next_pool_producer_id(now)
            return None if taken is None else taken[0]

        result = transactions.init_transactional(
            self.state.transactional_ids.get(transactional_id),
            transactional_id=transactional_id,
            timeout_ms=timeout_ms,
            expected=expected,
            new_producer_id=new_producer_id,
            now_ms=now.wall_ms,
        )
        offset = self.commit([result.record] if result.record else [], now)
        error = result.error
        if error == ErrorCode.producer_fenced and version < 4:
            error = ErrorCode.invalid_producer_epoch  # what clients before v4 understand
        return self._init_reply(request, error, result.producer_id, result.producer_epoch, offset)

    def _init_reply(
        self,
        request: Request,
        error: ErrorCode,
        producer_id: int = -1,
        producer_epoch: int = -1,
        durable_offset: int = NO_WAIT,
    ) -> Reply:
        if error:
            producer_id, producer_epoch = -1, -1
        body = _response(
            request,
            error_code=error,
            producer_id=i64(producer_id),
            producer_epoch=i16(producer_epoch),
        )
        return Reply(body, durable_offset)


_NO_THROTTLE = datetime.timedelta(0)


def _response(request: Request, **fields: Any) -> Any:
    """The response entity for the request's API version (throttle time filled in)."""
    cls: Any = response_class(request.api_key, request.api_version)
    return cls(throttle_time=_NO_THROTTLE, **fields)


def _first_listener(listeners: tuple[str, ...]) -> tuple[str, int]:
    """(host, port) of a registration's first ``NAME://host:port`` listener, or ("", -1)."""
    for listener in listeners:
        address = listener.split("://", 1)[-1]
        host, _, port = address.rpartition(":")
        if port.isdigit():
            return host.strip("[]"), int(port)
    return "", -1


def _build(cls: Any, **fields: Any) -> Any:
    """Instantiate a kio entity with the given fields that its version has (older versions
    lack e.g. throttle_time, cluster_id or rack)."""
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{name: value for name, value in fields.items() if name in known})
