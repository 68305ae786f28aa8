"""The cluster and its brokers: KRaft's ClusterControlManager (and BrokerHeartbeatManager).

Owns the cluster id, this controller's node id and every broker registration; decides
registrations, heartbeats and unregistrations; replays its own records. Registrations are
durable; sessions (liveness) are in memory only, as in KRaft: after a restart every
registered broker starts a fresh session, so a second incarnation cannot take over an id
just because the controller restarted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from kio.schema.errors import ErrorCode

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.kafka import DEFAULT_SESSION_TIMEOUT_MS
from pidctl.controller.core.records import (
    BrokerRegistered,
    BrokerUnregistered,
    ClusterCreated,
    ControllerStarted,
    Record,
)
from pidctl.controller.core.result import ControllerResult, answer

#: ErrorCode.none, looked up once (a member read through its enum class costs ~120 ns).
_NO_ERROR: Final = ErrorCode.none


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    incarnation_id: str
    epoch: int
    rack: str | None = None
    listeners: tuple[str, ...] = ()


@dataclass(slots=True)
class _Session:
    last_contact_ms: int
    fenced: bool = True  # KRaft registers brokers fenced until their first heartbeat


class BrokerSessions:
    """When each registered broker was last heard from, and whether it is fenced."""

    def __init__(self, timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS) -> None:
        self.timeout_ms = timeout_ms
        self._sessions: dict[int, _Session] = {}

    def start(self, broker_id: int, now_ms: int, *, fenced: bool = True) -> None:
        """A (re-)registration: the broker is alive and fenced until it heartbeats (or, after
        a restart, ``fenced=False``: as it is taken to have been)."""
        self._sessions[broker_id] = _Session(now_ms, fenced=fenced)

    def touch(self, broker_id: int, now_ms: int) -> _Session:
        session = self._sessions.setdefault(broker_id, _Session(now_ms))
        session.last_contact_ms = now_ms
        return session

    def remove(self, broker_id: int) -> None:
        self._sessions.pop(broker_id, None)

    def _alive(self, session: _Session | None, now_ms: int) -> bool:
        return session is not None and now_ms - session.last_contact_ms <= self.timeout_ms

    def has_valid_session(self, broker_id: int, now_ms: int) -> bool:
        """Kafka's BrokerHeartbeatManager.hasValidSession: unfenced (by its own heartbeat)
        and heard from within the session timeout. Only such a broker keeps another
        incarnation from registering with its id."""
        session = self._sessions.get(broker_id)
        return self._alive(session, now_ms) and not (session is None or session.fenced)

    def is_fenced(self, broker_id: int, now_ms: int) -> bool:
        """Fenced: by a heartbeat (it asked to be, or shut down), or silent for longer than
        the session timeout."""
        session = self._sessions.get(broker_id)
        if session is None or not self._alive(session, now_ms):
            return True
        return session.fenced


def next_broker_state(fenced: bool, want_fence: bool, want_shut_down: bool) -> tuple[bool, bool]:
    """A heartbeating broker's next state, as (fenced, should shut down): KRaft's
    calculateNextBrokerState for a broker with no partition leaderships and caught up, so
    that its CONTROLLED_SHUTDOWN state is never entered (SHUTDOWN_NOW at once)."""
    if fenced:
        if want_shut_down:
            return True, True  # SHUTDOWN_NOW
        return want_fence, False  # unfenced once it stops asking to be fenced
    if want_fence or want_shut_down:
        return True, want_shut_down  # FENCED, or SHUTDOWN_NOW
    return False, False


@dataclass(frozen=True, slots=True)
class Registered:
    error: ErrorCode = ErrorCode.none
    broker_epoch: int = -1


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    error: ErrorCode = ErrorCode.none
    is_fenced: bool = True
    should_shut_down: bool = False


@dataclass(slots=True)
class ClusterControlManager:
    """Cluster identity and broker registrations (durable), broker sessions (in memory)."""

    cluster_id: str | None = None
    node_id: int | None = None
    brokers: dict[int, BrokerRegistration] = field(default_factory=dict)
    sessions: BrokerSessions = field(default_factory=BrokerSessions, compare=False, repr=False)

    # -- decisions ------------------------------------------------------------------------

    def create_cluster(self, cluster_id: str, node_id: int) -> ControllerResult[None]:
        """The first record of every log."""
        return ControllerResult((ClusterCreated(cluster_id, node_id),), None)

    def controller_started(self, node_id: int, version: str) -> ControllerResult[None]:
        """An audit marker at every start: which node, which pidctl version."""
        return ControllerResult((ControllerStarted(node_id, version),), None)

    def check_broker_epoch(self, broker_id: int, broker_epoch: int) -> ErrorCode:
        """STALE_BROKER_EPOCH unless ``broker_epoch`` is the broker's current one."""
        registration = self.brokers.get(broker_id)
        if registration is None or registration.epoch != broker_epoch:
            return ErrorCode.stale_broker_epoch
        return _NO_ERROR  # (every AllocateProducerIds of a broker asks)

    def register(
        self,
        *,
        broker_id: int,
        cluster_id: str,
        incarnation_id: str,
        rack: str | None,
        listeners: tuple[str, ...],
        now_ms: int,
        next_offset: int,
        migrating_zk_broker: bool = False,
    ) -> ControllerResult[Registered]:
        """BrokerRegistration: the same incarnation keeps its epoch; a new one gets a new
        epoch (the offset its record will get, ``next_offset``) unless the old incarnation
        has a valid session (unfenced and heard from within the session timeout: as in
        Kafka, a fenced broker's id may be taken over at once). A broker migrating from
        ZooKeeper is refused BROKER_ID_NOT_REGISTERED, as Kafka 4 refuses it."""
        if cluster_id != self.cluster_id:
            return answer(Registered(ErrorCode.inconsistent_cluster_id))
        if broker_id < 0:
            return answer(Registered(ErrorCode.invalid_request))
        existing = self.brokers.get(broker_id)
        if existing is not None and existing.incarnation_id == incarnation_id:
            self.sessions.touch(broker_id, now_ms)
            return answer(Registered(broker_epoch=existing.epoch))
        if existing is not None and self.sessions.has_valid_session(broker_id, now_ms):
            return answer(Registered(ErrorCode.duplicate_broker_registration))
        if migrating_zk_broker:
            # Kafka 4 (no ZooKeeper): "Controller does not support registering ZK brokers."
            return answer(Registered(ErrorCode.broker_id_not_registered))
        self.sessions.start(broker_id, now_ms)
        record = BrokerRegistered(broker_id, incarnation_id, next_offset, rack, listeners)
        return ControllerResult((record,), Registered(broker_epoch=next_offset))

    def heartbeat(
        self,
        *,
        broker_id: int,
        broker_epoch: int,
        want_fence: bool,
        want_shut_down: bool,
        now_ms: int,
    ) -> ControllerResult[HeartbeatAnswer]:
        """BrokerHeartbeat: keeps the session alive and moves the broker in or out of
        fencing, as KRaft's BrokerHeartbeatManager.calculateNextBrokerState does for a broker
        that leads no partition and has caught up (pidctl has neither partitions nor a
        metadata log to replay): a controlled shutdown is granted at once and fences the
        broker, whose next heartbeat without it unfences it again."""
        error = self.check_broker_epoch(broker_id, broker_epoch)
        if error:
            return answer(HeartbeatAnswer(error))
        was_fenced = self.sessions.is_fenced(broker_id, now_ms)  # (silent too long: fenced)
        fenced, shut_down = next_broker_state(was_fenced, want_fence, want_shut_down)
        self.sessions.touch(broker_id, now_ms).fenced = fenced
        return answer(HeartbeatAnswer(is_fenced=fenced, should_shut_down=shut_down))

    def unregister(self, broker_id: int) -> ControllerResult[ErrorCode]:
        """UnregisterBroker: BROKER_ID_NOT_REGISTERED if there is no registration."""
        registration = self.brokers.get(broker_id)
        if registration is None:
            return answer(ErrorCode.broker_id_not_registered)
        self.sessions.remove(broker_id)
        return ControllerResult(
            (BrokerUnregistered(broker_id, registration.epoch),), ErrorCode.none
        )

    def is_fenced(self, broker_id: int, now_ms: int) -> bool:
        return self.sessions.is_fenced(broker_id, now_ms)

    def restore_sessions(self, now_ms: int) -> None:
        """After recovery: give every registered broker a fresh session from now, unfenced.
        A new KRaft controller does so for every broker its metadata says is unfenced;
        pidctl keeps no fencing in its log and takes every broker to have been unfenced, the
        safe side: no other incarnation takes an id over within a session timeout of the
        restart, and a silent broker is fenced after it."""
        for broker_id in self.brokers:
            self.sessions.start(broker_id, now_ms, fenced=False)

    # -- replay ---------------------------------------------------------------------------

    def replay(self, offset: int, record: object) -> None:
        """Apply one of this manager's records; checks come before any change."""
        match record:
            case ClusterCreated():
                if self.cluster_id is not None:
                    raise InvariantViolation(f"offset {offset}: cluster created twice")
                self.cluster_id = record.cluster_id
                self.node_id = record.node_id
            case BrokerRegistered():
                if record.broker_epoch != offset:
                    raise InvariantViolation(
                        f"offset {offset}: broker epoch {record.broker_epoch} is not the "
                        "record offset"
                    )
                previous = self.brokers.get(record.broker_id)
                if previous is not None and previous.epoch >= record.broker_epoch:
                    raise InvariantViolation(f"offset {offset}: broker epoch did not increase")
                self.brokers[record.broker_id] = BrokerRegistration(
                    record.broker_id,
                    record.incarnation_id,
                    record.broker_epoch,
                    record.rack,
                    record.listeners,
                )
            case BrokerUnregistered():
                current = self.brokers.get(record.broker_id)
                if current is None or current.epoch != record.broker_epoch:
                    raise InvariantViolation(
                        f"offset {offset}: unregisters broker {record.broker_id} "
                        f"epoch {record.broker_epoch}, which is not registered"
                    )
                del self.brokers[record.broker_id]
            case ControllerStarted():
                pass  # an audit marker: no state

    # -- snapshots ------------------------------------------------------------------------

    def copy(self) -> ClusterControlManager:
        """A copy later records do not change (registrations are immutable)."""
        return ClusterControlManager(self.cluster_id, self.node_id, dict(self.brokers))

    def snapshot_records(self) -> Iterator[tuple[int, Record]]:
        """The cluster restated as its log's own records, each at the offset it was
        written at: its creation, then every registration (a broker's epoch is its offset)."""
        if self.cluster_id is None or self.node_id is None:
            return
        yield 0, ClusterCreated(self.cluster_id, self.node_id)
        for b in sorted(self.brokers.values(), key=lambda registration: registration.epoch):
            yield (
                b.epoch,
                BrokerRegistered(b.broker_id, b.incarnation_id, b.epoch, b.rack, b.listeners),
            )
