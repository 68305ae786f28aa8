"""ClusterControlManager: registrations, heartbeats, fencing (KRaft's rules)."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from pidctl.controller.core.cluster import HeartbeatAnswer, Registered, next_broker_state
from pidctl.controller.core.records import BrokerRegistered, BrokerUnregistered
from pidctl.controller.core.state import ControllerState
from tests.controller.core.kraft import apply, new_state
from tests.controller.core.snapshots import through_snapshot


def _state(session_timeout_ms: int = 9000) -> ControllerState:
    return new_state().configure(session_timeout_ms=session_timeout_ms)


def _register(
    state: ControllerState, broker_id: int, incarnation: str, now: int, cluster_id: str = "c"
) -> Registered:
    result = state.cluster.register(
        broker_id=broker_id,
        cluster_id=cluster_id,
        incarnation_id=incarnation,
        rack=None,
        listeners=(),
        now_ms=now,
        next_offset=state.next_offset,
    )
    return apply(state, result)


def _beat(
    state: ControllerState,
    epoch: int,
    now: int,
    *,
    broker_id: int = 1,
    shut_down: bool = False,
    fence: bool = False,
) -> HeartbeatAnswer:
    result = state.cluster.heartbeat(
        broker_id=broker_id,
        broker_epoch=epoch,
        want_fence=fence,
        want_shut_down=shut_down,
        now_ms=now,
    )
    assert result.records == ()  # sessions are not durable
    return apply(state, result)


def test_epoch_is_the_registration_record_offset() -> None:
    state = _state()
    first = _register(state, 1, "inc-a", 0)
    second = _register(state, 2, "inc-b", 0)
    assert (first.broker_epoch, second.broker_epoch) == (1, 2)
    assert state.cluster.brokers[1].epoch == 1


def test_the_registration_record() -> None:
    state = _state()
    result = state.cluster.register(
        broker_id=3,
        cluster_id="c",
        incarnation_id="inc",
        rack="r1",
        listeners=("PLAINTEXT://h:9092",),
        now_ms=0,
        next_offset=state.next_offset,
    )
    assert result.records == (BrokerRegistered(3, "inc", 1, "r1", ("PLAINTEXT://h:9092",)),)


def test_same_incarnation_is_idempotent() -> None:
    state = _state()
    first = _register(state, 1, "inc-a", 0)
    offset = state.next_offset
    again = _register(state, 1, "inc-a", 100_000)
    assert again.broker_epoch == first.broker_epoch
    assert state.next_offset == offset  # nothing written


def test_new_incarnation_while_session_alive_is_a_duplicate() -> None:
    state = _state()
    epoch = _register(state, 1, "inc-a", 0).broker_epoch
    _beat(state, epoch, 0)  # unfenced
    offset = state.next_offset
    assert _register(state, 1, "inc-b", 9000).error == ErrorCode.duplicate_broker_registration
    assert state.next_offset == offset


@pytest.mark.parametrize("fenced_by", ["registration", "heartbeat"])
def test_new_incarnation_of_a_fenced_broker_registers_at_once(fenced_by: str) -> None:
    # Kafka's rule (BrokerHeartbeatManager.hasValidSession): a fenced broker has no valid
    # session, whether it never heartbeat since registering or asked to be fenced.
    state = _state()
    old = _register(state, 1, "inc-a", 0)
    if fenced_by == "heartbeat":
        _beat(state, old.broker_epoch, 1)
        _beat(state, old.broker_epoch, 2, fence=True)
    new = _register(state, 1, "inc-b", 3)
    assert new.error == ErrorCode.none and new.broker_epoch > old.broker_epoch
    assert _beat(state, old.broker_epoch, 4).error == ErrorCode.stale_broker_epoch


def test_new_incarnation_after_session_expiry_gets_higher_epoch() -> None:
    state = _state()
    old = _register(state, 1, "inc-a", 0)
    new = _register(state, 1, "inc-b", 9001)
    assert new.error == ErrorCode.none
    assert new.broker_epoch > old.broker_epoch


def test_wrong_cluster_id_and_negative_broker_id() -> None:
    state = _state()
    assert _register(state, 1, "x", 0, cluster_id="other").error == (
        ErrorCode.inconsistent_cluster_id
    )
    assert _register(state, -2, "x", 0).error == ErrorCode.invalid_request


def test_heartbeat_unfences_and_stale_epoch_is_refused() -> None:
    state = _state()
    epoch = _register(state, 1, "inc-a", 0).broker_epoch
    assert state.cluster.is_fenced(1, 0)  # registered fenced, as in KRaft
    beat = _beat(state, epoch, 10)
    assert beat.error == ErrorCode.none and not beat.is_fenced
    assert _beat(state, epoch + 1, 10).error == ErrorCode.stale_broker_epoch
    assert _beat(state, epoch, 10, broker_id=9).error == ErrorCode.stale_broker_epoch


def test_silent_broker_is_fenced_after_session_timeout() -> None:
    state = _state()
    epoch = _register(state, 1, "inc-a", 0).broker_epoch
    _beat(state, epoch, 0)
    assert not state.cluster.is_fenced(1, 9000)
    assert state.cluster.is_fenced(1, 9001)


def test_controlled_shutdown_completes_at_once() -> None:
    state = _state()
    epoch = _register(state, 1, "inc-a", 0).broker_epoch
    beat = _beat(state, epoch, 1, shut_down=True)
    assert beat.should_shut_down and beat.is_fenced


def test_a_shut_down_broker_is_unfenced_by_its_next_heartbeat_as_in_kraft() -> None:
    # KRaft fences a broker whose shutdown it granted (SHUTDOWN_NOW); its next heartbeat
    # that asks for neither is a fenced broker's that has caught up: unfenced.
    state = _state()
    epoch = _register(state, 1, "inc-a", 0).broker_epoch
    _beat(state, epoch, 1)
    assert _beat(state, epoch, 2, shut_down=True) == HeartbeatAnswer(
        is_fenced=True, should_shut_down=True
    )
    assert _beat(state, epoch, 3) == HeartbeatAnswer(is_fenced=False, should_shut_down=False)
    assert not state.cluster.is_fenced(1, 3)


@pytest.mark.parametrize(
    ("fenced", "want_fence", "want_shut_down", "expected"),
    [
        (True, False, False, (False, False)),  # FENCED -> UNFENCED (caught up)
        (True, True, False, (True, False)),  # stays FENCED
        (True, False, True, (True, True)),  # SHUTDOWN_NOW
        (True, True, True, (True, True)),
        (False, False, False, (False, False)),  # stays UNFENCED
        (False, True, False, (True, False)),  # FENCED on request
        (False, False, True, (True, True)),  # no leaderships: SHUTDOWN_NOW, not CONTROLLED
        (False, True, True, (True, True)),
    ],
)
def test_next_broker_state_is_krafts(
    fenced: bool, want_fence: bool, want_shut_down: bool, expected: tuple[bool, bool]
) -> None:
    assert next_broker_state(fenced, want_fence, want_shut_down) == expected


def test_a_broker_migrating_from_zookeeper_is_refused_as_kafka_4_refuses_it() -> None:
    state = _state()
    result = state.cluster.register(
        broker_id=1,
        cluster_id="c",
        incarnation_id="inc-a",
        rack=None,
        listeners=(),
        now_ms=0,
        next_offset=state.next_offset,
        migrating_zk_broker=True,
    )
    assert result.records == ()
    assert apply(state, result).error == ErrorCode.broker_id_not_registered


def test_unregister() -> None:
    state = _state()
    epoch = _register(state, 1, "inc-a", 0).broker_epoch
    result = state.cluster.unregister(1)
    assert result.records == (BrokerUnregistered(1, epoch),)
    assert apply(state, result) == ErrorCode.none
    assert 1 not in state.cluster.brokers
    assert apply(state, state.cluster.unregister(1)) == ErrorCode.broker_id_not_registered


def test_restarted_controller_gives_every_broker_a_fresh_session() -> None:
    state = _state()
    _register(state, 1, "inc-a", 0)
    again = through_snapshot(state)
    again.cluster.restore_sessions(50_000)
    # A second incarnation cannot take over just because the controller restarted: every
    # broker is taken to be unfenced, with a session from the restart.
    assert not again.cluster.is_fenced(1, 59_000)
    assert _register(again, 1, "inc-b", 55_000).error == ErrorCode.duplicate_broker_registration
    assert again.cluster.is_fenced(1, 59_001)
    assert _register(again, 1, "inc-b", 59_001).error == ErrorCode.none
