"""The controller: one handler per API, turning a decoded request into records and a response.

No I/O here. ``handle`` decides, appends the records to the log's buffer (which never
waits), replays them onto the in-memory state at once so the next decision sees them, and
says which offset must be durable before the response may be sent. Decisions run one at a
time on the event loop, so the logic needs no locks.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from protocol.api_versions import build_api_versions_response, has_valid_client_software
from protocol.apis import ApiKey, SupportedApis, response_class, supported_apis
from protocol.codec import Request

from . import brokers, producer_ids
from .brokers import BrokerSessions
from .producer_ids import ProducerIdRange
from .records import ProducerIdsGranted, Record
from .state import ControllerState

#: Versions served, per API. kio's highest known versions, within what Kafka 4.x speaks.
SERVED_APIS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.BROKER_REGISTRATION: (0, 4),
    ApiKey.BROKER_HEARTBEAT: (0, 2),
    ApiKey.UNREGISTER_BROKER: (0, 0),
    ApiKey.ALLOCATE_PRODUCER_IDS: (0, 0),
}

NO_WAIT = -1


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
    """Who is asking: recorded in grants (the audit trail) and used for authorisation."""

    principal: str = "User:ANONYMOUS"
    peer: str = ""


Handler = Callable[["Controller", Request, Now, ConnectionInfo], Reply]


class Controller:
    """Turns requests into records and responses against one :class:`ControllerState`."""

    def __init__(
        self,
        state: ControllerState,
        sink: RecordSink,
        *,
        pid_range: ProducerIdRange | None = None,
        sessions: BrokerSessions | None = None,
        on_grant: Callable[[ProducerIdsGranted], None] | None = None,
    ) -> None:
        self.state = state
        self.sink = sink
        self.pid_range = pid_range or ProducerIdRange()
        self.sessions = sessions or BrokerSessions()
        self.on_grant = on_grant
        self.supported: SupportedApis = supported_apis(SERVED_APIS)
        self._handlers: dict[int, Handler] = {
            ApiKey.API_VERSIONS: Controller._api_versions,
            ApiKey.BROKER_REGISTRATION: Controller._broker_registration,
            ApiKey.BROKER_HEARTBEAT: Controller._broker_heartbeat,
            ApiKey.UNREGISTER_BROKER: Controller._unregister_broker,
            ApiKey.ALLOCATE_PRODUCER_IDS: Controller._allocate_producer_ids,
        }

    def handle(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        """Decide one request. The caller sends ``reply.body`` once ``durable_offset`` is."""
        return self._handlers[request.api_key](self, request, now, conn)

    def commit(self, records: list[Record], now: Now) -> int:
        """Append records and apply them to the state; return the offset to wait for."""
        for record in records:
            offset = self.sink.append(record, now.wall_ms)
            self.state.replay(offset, record)
            if isinstance(record, ProducerIdsGranted) and self.on_grant is not None:
                self.on_grant(record)
        # Wait for everything decided so far, not just our records: a response may report
        # state (a retried registration's epoch) that an earlier, still pending record made.
        return self.state.next_offset - 1

    def snapshot(self) -> dict[str, Any]:
        return self.state.to_snapshot()

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
        if body.incarnation_id is None:
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
        decision = brokers.unregister(self.state, self.sessions, broker_id=request.body.broker_id)
        offset = self.commit(decision.records, now)
        message = None if decision.error == ErrorCode.none else "broker is not registered"
        return Reply(_response(request, error_code=decision.error, error_message=message), offset)

    def _allocate_producer_ids(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        body = request.body
        allocation = producer_ids.allocate(
            self.state,
            self.pid_range,
            broker_id=body.broker_id,
            broker_epoch=body.broker_epoch,
            principal=conn.principal,
            client_id=request.header.client_id,
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


_NO_THROTTLE = datetime.timedelta(0)


def _response(request: Request, **fields: Any) -> Any:
    """The response entity for the request's API version (throttle time filled in)."""
    cls: Any = response_class(request.api_key, request.api_version)
    return cls(throttle_time=_NO_THROTTLE, **fields)
