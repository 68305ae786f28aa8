from __future__ import annotations

from kio.schema.errors import ErrorCode

from controller import brokers
from controller.brokers import BrokerSessions
from controller.records import ClusterCreated
from controller.state import ControllerState

CLUSTER = "cluster-a"


def _state() -> ControllerState:
    state = ControllerState()
    state.replay(0, ClusterCreated(CLUSTER, 1))
    return state


def _register(
    state: ControllerState, sessions: BrokerSessions, broker_id: int, incarnation: str, now: int
) -> brokers.Decision:
    decision = brokers.register(
        state, sessions, broker_id=broker_id, cluster_id=CLUSTER, incarnation_id=incarnation,
        rack=None, listeners=(), now_ms=now,
    )  # fmt: skip
    for record in decision.records:
        state.replay(state.next_offset, record)
    return decision


def test_epoch_is_the_registration_record_offset() -> None:
    state, sessions = _state(), BrokerSessions()
    first = _register(state, sessions, 1, "inc-a", 0)
    second = _register(state, sessions, 2, "inc-b", 0)
    assert (first.broker_epoch, second.broker_epoch) == (1, 2)
    assert state.brokers[1].epoch == 1


def test_same_incarnation_is_idempotent() -> None:
    state, sessions = _state(), BrokerSessions()
    first = _register(state, sessions, 1, "inc-a", 0)
    again = _register(state, sessions, 1, "inc-a", 100_000)
    assert again.broker_epoch == first.broker_epoch
    assert again.records == []


def test_new_incarnation_while_session_alive_is_a_duplicate() -> None:
    state, sessions = _state(), BrokerSessions(timeout_ms=9000)
    _register(state, sessions, 1, "inc-a", 0)
    decision = _register(state, sessions, 1, "inc-b", 9000)
    assert decision.error == ErrorCode.duplicate_broker_registration
    assert decision.records == []


def test_new_incarnation_after_session_expiry_gets_higher_epoch() -> None:
    state, sessions = _state(), BrokerSessions(timeout_ms=9000)
    old = _register(state, sessions, 1, "inc-a", 0)
    new = _register(state, sessions, 1, "inc-b", 9001)
    assert new.error == ErrorCode.none
    assert new.broker_epoch > old.broker_epoch


def test_wrong_cluster_id() -> None:
    state, sessions = _state(), BrokerSessions()
    decision = brokers.register(
        state, sessions, broker_id=1, cluster_id="other", incarnation_id="x", rack=None,
        listeners=(), now_ms=0,
    )  # fmt: skip
    assert decision.error == ErrorCode.inconsistent_cluster_id


def test_heartbeat_unfences_and_stale_epoch_is_refused() -> None:
    state, sessions = _state(), BrokerSessions(timeout_ms=9000)
    epoch = _register(state, sessions, 1, "inc-a", 0).broker_epoch
    assert sessions.is_fenced(1, 0)  # registered fenced, as in KRaft
    beat = brokers.heartbeat(
        state, sessions, broker_id=1, broker_epoch=epoch, want_fence=False,
        want_shut_down=False, now_ms=10,
    )  # fmt: skip
    assert beat.error == ErrorCode.none and not beat.is_fenced
    stale = brokers.heartbeat(
        state, sessions, broker_id=1, broker_epoch=epoch + 1, want_fence=False,
        want_shut_down=False, now_ms=10,
    )  # fmt: skip
    assert stale.error == ErrorCode.stale_broker_epoch
    unknown = brokers.heartbeat(
        state, sessions, broker_id=9, broker_epoch=epoch, want_fence=False,
        want_shut_down=False, now_ms=10,
    )  # fmt: skip
    assert unknown.error == ErrorCode.stale_broker_epoch


def test_silent_broker_is_fenced_after_session_timeout() -> None:
    state, sessions = _state(), BrokerSessions(timeout_ms=9000)
    epoch = _register(state, sessions, 1, "inc-a", 0).broker_epoch
    brokers.heartbeat(
        state, sessions, broker_id=1, broker_epoch=epoch, want_fence=False,
        want_shut_down=False, now_ms=0,
    )  # fmt: skip
    assert not sessions.is_fenced(1, 9000)
    assert sessions.is_fenced(1, 9001)


def test_controlled_shutdown_completes_at_once() -> None:
    state, sessions = _state(), BrokerSessions()
    epoch = _register(state, sessions, 1, "inc-a", 0).broker_epoch
    beat = brokers.heartbeat(
        state, sessions, broker_id=1, broker_epoch=epoch, want_fence=False,
        want_shut_down=True, now_ms=1,
    )  # fmt: skip
    assert beat.should_shut_down and beat.is_fenced


def test_unregister() -> None:
    state, sessions = _state(), BrokerSessions()
    _register(state, sessions, 1, "inc-a", 0)
    decision = brokers.unregister(state, sessions, broker_id=1)
    state.replay(state.next_offset, decision.records[0])
    assert 1 not in state.brokers
    again = brokers.unregister(state, sessions, broker_id=1)
    assert again.error == ErrorCode.broker_id_not_registered
