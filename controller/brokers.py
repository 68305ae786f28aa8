"""Broker registration, heartbeats and fencing: KRaft's ClusterControlManager rules, pure.

Registrations are durable records; sessions (liveness) are in memory only, as in KRaft's
BrokerHeartbeatManager: after a restart every registered broker starts a fresh session, so a
second incarnation cannot take over an id just because the controller restarted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

from .records import BrokerRegistered, BrokerUnregistered, Record
from .state import ControllerState

#: Kafka's ``broker.session.timeout.ms`` default.
DEFAULT_SESSION_TIMEOUT_MS = 9000


@dataclass(slots=True)
class _Session:
    last_contact_ms: int
    wants_fence: bool = True  # KRaft registers brokers fenced until their first heartbeat
    shutting_down: bool = False


class BrokerSessions:
    """When each registered broker was last heard from, and whether it is fenced."""

    def __init__(self, timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS) -> None:
        self.timeout_ms = timeout_ms
        self._sessions: dict[int, _Session] = {}

    def start(self, broker_id: int, now_ms: int) -> None:
        """A (re-)registration: the broker is alive and fenced until it heartbeats."""
        self._sessions[broker_id] = _Session(now_ms)

    def touch(self, broker_id: int, now_ms: int) -> _Session:
        session = self._sessions.setdefault(broker_id, _Session(now_ms))
        session.last_contact_ms = now_ms
        return session

    def remove(self, broker_id: int) -> None:
        self._sessions.pop(broker_id, None)

    def has_valid_session(self, broker_id: int, now_ms: int) -> bool:
        session = self._sessions.get(broker_id)
        return session is not None and now_ms - session.last_contact_ms <= self.timeout_ms

    def is_fenced(self, broker_id: int, now_ms: int) -> bool:
        """Fenced: asked to be, shutting down, or silent for longer than the session timeout."""
        session = self._sessions.get(broker_id)
        if session is None or not self.has_valid_session(broker_id, now_ms):
            return True
        return session.wants_fence or session.shutting_down

    def restore(self, broker_ids: list[int], now_ms: int) -> None:
        """After recovery: give every registered broker a fresh session from now."""
        for broker_id in broker_ids:
            self._sessions[broker_id] = _Session(now_ms)


@dataclass(frozen=True, slots=True)
class Decision:
    """What a request decided: an error code, records to make durable, and response values."""

    error: ErrorCode = ErrorCode.none
    records: list[Record] = field(default_factory=list)
    broker_epoch: int = -1
    is_fenced: bool = True
    should_shut_down: bool = False


def check_broker_epoch(state: ControllerState, broker_id: int, broker_epoch: int) -> ErrorCode:
    """STALE_BROKER_EPOCH unless ``broker_epoch`` is the broker's current registration epoch."""
    registration = state.brokers.get(broker_id)
    if registration is None or registration.epoch != broker_epoch:
        return ErrorCode.stale_broker_epoch
    return ErrorCode.none


def register(
    state: ControllerState,
    sessions: BrokerSessions,
    *,
    broker_id: int,
    cluster_id: str,
    incarnation_id: str,
    rack: str | None,
    listeners: tuple[str, ...],
    now_ms: int,
) -> Decision:
    """BrokerRegistration: the same incarnation keeps its epoch; a new one gets a new epoch
    (the offset of its record) once the old incarnation's session has expired."""
    if cluster_id != state.cluster_id:
        return Decision(ErrorCode.inconsistent_cluster_id)
    if broker_id < 0:
        return Decision(ErrorCode.invalid_request)
    existing = state.brokers.get(broker_id)
    if existing is not None and existing.incarnation_id == incarnation_id:
        sessions.touch(broker_id, now_ms)
        return Decision(broker_epoch=existing.epoch)
    if existing is not None and sessions.has_valid_session(broker_id, now_ms):
        return Decision(ErrorCode.duplicate_broker_registration)
    epoch = state.next_offset  # the offset the registration record will get
    sessions.start(broker_id, now_ms)
    record = BrokerRegistered(broker_id, incarnation_id, epoch, rack, listeners)
    return Decision(records=[record], broker_epoch=epoch)


def heartbeat(
    state: ControllerState,
    sessions: BrokerSessions,
    *,
    broker_id: int,
    broker_epoch: int,
    want_fence: bool,
    want_shut_down: bool,
    now_ms: int,
) -> Decision:
    """BrokerHeartbeat: keeps the session alive and moves the broker in or out of fencing.

    pidctl has no partitions to move, so a controlled shutdown completes at once and a broker
    is always caught up with the (empty) metadata it would replicate.
    """
    error = check_broker_epoch(state, broker_id, broker_epoch)
    if error:
        return Decision(error)
    session = sessions.touch(broker_id, now_ms)
    session.wants_fence = want_fence
    session.shutting_down = session.shutting_down or want_shut_down
    return Decision(
        is_fenced=sessions.is_fenced(broker_id, now_ms),
        should_shut_down=session.shutting_down,
    )


def unregister(state: ControllerState, sessions: BrokerSessions, *, broker_id: int) -> Decision:
    """UnregisterBroker: drop the registration; BROKER_ID_NOT_REGISTERED if there is none."""
    registration = state.brokers.get(broker_id)
    if registration is None:
        return Decision(ErrorCode.broker_id_not_registered)
    sessions.remove(broker_id)
    return Decision(records=[BrokerUnregistered(broker_id, registration.epoch)])
