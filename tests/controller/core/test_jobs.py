"""Named job versions get their blocks back (controller/core/jobs.py), decided and replayed:
for their owner only, bounded, by clocks that a step of the wall clock cannot fool, and
refused rather than answered anew after a damaged tail."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from pidctl.controller.core.errors import InvariantViolation
from pidctl.controller.core.jobs import CLOCK_RECORD_INTERVAL_MS, JobKey, parse_job_key
from pidctl.controller.core.producer_ids import Block, ProducerIdRange
from pidctl.controller.core.records import (
    JobAllocationExpired,
    JobBlockRecorded,
    JobClockAdvanced,
    ProducerIdsGranted,
    ProducerIdsLeased,
    ProducerIdsReserved,
)
from pidctl.controller.core.reservations import DEFAULT_RESERVATION_SIZE
from pidctl.controller.core.state import ControllerState
from pidctl.protocol.headers import client_id_of
from tests.controller.core.kraft import apply, new_state, replay
from tests.controller.core.snapshots import through_snapshot

DAY = 86_400_000
OWNER = "User:j"
OTHER = "User:intruder"


def _state(first: int = 0) -> ControllerState:
    state = new_state(pid_range=ProducerIdRange(first=first) if first else None)
    return state.configure(job_allocation_reuse_ms=DAY, job_allocation_expiration_ms=7 * DAY)


def _block(
    state: ControllerState,
    app: str,
    version: int,
    block: int,
    now_ms: int = 0,
    *,
    mono_ms: int | None = None,
    principal: str = OWNER,
) -> Block:
    """Ask for a block; the wall and monotonic clocks both at ``now_ms`` unless told."""
    key = JobKey(app, version, block)
    result = state.jobs.allocate(
        key,
        wall_ms=now_ms,
        mono_ms=now_ms if mono_ms is None else mono_ms,
        principal=principal,
        client_id=key.client_id(),
    )
    return apply(state, result)


def _restarted(state: ControllerState, wall_ms: int, mono_ms: int = 0) -> ControllerState:
    """The state a restart recovers (through a snapshot), started at these clocks."""
    restarted = through_snapshot(state)
    restarted.configure(job_allocation_reuse_ms=DAY, job_allocation_expiration_ms=7 * DAY)
    restarted.jobs.start(wall_ms, mono_ms)
    return restarted


def test_the_key_travels_in_the_client_id() -> None:
    key = JobKey("nightly/orders", 20261123, 2)
    assert key.client_id() == "pidctl-job/20261123/2/nightly/orders"
    assert parse_job_key(key.client_id()) == key
    assert parse_job_key("local-1700000000") is None
    assert parse_job_key(None) is None


@pytest.mark.parametrize(
    "client_id",
    ["pidctl-job/", "pidctl-job/1/0/", "pidctl-job/x/0/a", "pidctl-job/1/-1/a", "pidctl-job/1/a"],
)
def test_a_malformed_key_is_refused(client_id: str) -> None:
    with pytest.raises(ValueError, match="job key"):
        parse_job_key(client_id)


def test_a_key_read_from_bytes_that_are_not_utf8_is_refused() -> None:
    """Two client ids whose app ids differ only in bytes that are not UTF-8 are read as one
    (each such byte as U+FFFD, as Kafka reads a client id): neither may name a job, or one
    app would be handed the other's blocks."""
    first, second = (client_id_of(b"pidctl-job/1/0/app-" + raw) for raw in (b"\xff", b"\xfe"))
    assert first == second
    with pytest.raises(ValueError, match="not UTF-8"):
        parse_job_key(first)


def test_a_block_index_past_the_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="block below 1000"):
        parse_job_key("pidctl-job/1/1000/app")


def test_first_run_grants_and_records_then_a_rerun_gets_the_same_blocks() -> None:
    state = _state(first=2**62)
    key = JobKey("app", 7, 0)
    result = state.jobs.allocate(
        key, wall_ms=5, mono_ms=5, principal=OWNER, client_id=key.client_id()
    )
    assert result.records == (
        ProducerIdsReserved(2**62 + 1000 + DEFAULT_RESERVATION_SIZE),
        ProducerIdsGranted(-1, -1, 2**62, 2**62 + 1000, OWNER, key.client_id(), "job"),
        JobBlockRecorded("app", 7, 0, 2**62, 5, OWNER, 5),
    )
    first = apply(state, result)
    second = _block(state, "app", 7, 1, now_ms=6)
    assert (first.first, second.first) == (2**62, 2**62 + 1000)
    # The re-run: the same blocks, nothing written, the high-water mark unchanged.
    again = state.jobs.allocate(
        key, wall_ms=10, mono_ms=10, principal=OWNER, client_id=key.client_id()
    )
    assert again.records == ()
    assert again.response == first
    assert _block(state, "app", 7, 1, now_ms=10) == second
    # A re-run with more partitions: one more block, recorded after the others, with the
    # version's stamps and owner.
    result = state.jobs.allocate(
        JobKey("app", 7, 2), wall_ms=11, mono_ms=11, principal=OWNER, client_id=None
    )
    assert result.records[-1] == JobBlockRecorded("app", 7, 2, 2**62 + 2000, 5, OWNER, 5)
    apply(state, result)
    held = state.jobs.apps.get("app")
    assert held is not None and held.blocks == [2**62, 2**62 + 1000, 2**62 + 2000]


def test_blocks_are_asked_for_in_order() -> None:
    state = _state()
    assert _block(state, "app", 1, 1) == Block(ErrorCode.invalid_request)
    _block(state, "app", 1, 0)
    assert _block(state, "app", 1, 2) == Block(ErrorCode.invalid_request)
    assert state.next_producer_id == 1000


def test_a_newer_version_gets_new_blocks_and_fences_the_older() -> None:
    state = _state()
    old = _block(state, "app", 1, 0)
    new = _block(state, "app", 2, 0)
    assert new.first == old.first + 1000
    assert _block(state, "app", 1, 0) == Block(ErrorCode.producer_fenced)
    assert _block(state, "other", 1, 0).first == new.first + 1000  # app ids are separate


def test_a_rerun_after_the_reuse_window_is_refused() -> None:
    """The brokers may have forgotten the PIDs' sequences: a re-run could write twice."""
    state = _state()
    _block(state, "app", 1, 0, now_ms=0)
    assert _block(state, "app", 1, 0, now_ms=DAY).error == ErrorCode.none
    assert _block(state, "app", 1, 0, now_ms=DAY + 1) == Block(ErrorCode.unknown_producer_id)
    assert _block(state, "app", 2, 0, now_ms=DAY + 1).error == ErrorCode.none


def test_a_refused_grant_records_nothing() -> None:
    state = _state(first=2**63 - 1001)
    assert _block(state, "app", 1, 0).error == ErrorCode.none
    result = state.jobs.allocate(
        JobKey("app", 1, 1), wall_ms=0, mono_ms=0, principal=OWNER, client_id=None
    )
    assert result.response.error == ErrorCode.unknown_server_error
    assert result.records == ()


# -- owners -------------------------------------------------------------------------------


def test_only_the_owner_is_answered_or_may_record_or_fence() -> None:
    """One PID is never handed to two principals: another principal can neither read the
    owner's blocks (a re-run), share its version (a block more), nor fence it (a newer
    version, or the largest one); it is refused as a principal without an ACL is, and
    nothing is recorded."""
    state = _state()
    owned = _block(state, "app", 5, 0)
    written = state.next_offset
    denied = Block(ErrorCode.transactional_id_authorization_failed)
    for version, block in [(5, 0), (5, 1), (6, 0), (2**63 - 1, 0), (4, 0)]:
        key = JobKey("app", version, block)
        result = state.jobs.allocate(key, wall_ms=1, mono_ms=1, principal=OTHER, client_id=None)
        assert (result.response, result.records) == (denied, ()), key
    assert state.jobs.refusal("app", OTHER) == ErrorCode.transactional_id_authorization_failed
    assert state.jobs.refusal("app", OWNER) == ErrorCode.none
    assert state.jobs.refusal("unknown", OTHER) == ErrorCode.none
    assert state.next_offset == written
    assert _block(state, "app", 5, 0) == owned  # the owner's re-run is untouched
    assert _block(state, "app", 6, 0).error == ErrorCode.none  # and it may go on
    # Another app id is the other principal's own.
    assert _block(state, "theirs", 1, 0, principal=OTHER).error == ErrorCode.none
    assert _block(state, "theirs", 1, 0).error == ErrorCode.transactional_id_authorization_failed


def test_ownership_is_in_the_log_and_in_snapshots() -> None:
    state = _state()
    key = JobKey("app", 1, 0)
    result = state.jobs.allocate(key, wall_ms=0, mono_ms=0, principal=OWNER, client_id=None)
    apply(state, result)
    replayed = _state()
    replay(replayed, *result.records)
    for restored in (replayed, through_snapshot(state)):
        held = restored.jobs.apps.get("app")
        assert held is not None and held.owner == OWNER
        refused = restored.jobs.refusal("app", OTHER)
        assert refused == ErrorCode.transactional_id_authorization_failed


def test_an_app_id_recorded_before_owners_is_anyones_until_a_new_version_claims_it() -> None:
    state = _state()
    replay(
        state,
        ProducerIdsGranted(-1, -1, 0, 1000, OWNER, None, "job"),
        JobBlockRecorded("old", 3, 0, 0, 0),  # as written before app ids had owners
    )
    assert _block(state, "old", 3, 0, principal=OTHER) == Block(ErrorCode.none, 0, 1000)
    assert _block(state, "old", 4, 0, principal=OTHER).error == ErrorCode.none
    assert _block(state, "old", 4, 0).error == ErrorCode.transactional_id_authorization_failed


def test_replay_refuses_a_block_naming_another_owner_than_its_version() -> None:
    state = _state()
    _block(state, "app", 1, 0)
    with pytest.raises(InvariantViolation, match="owns its version"):
        replay(state, JobBlockRecorded("app", 1, 1, 5000, 0, OTHER, 0))


# -- bounds -------------------------------------------------------------------------------


def test_an_app_id_longer_than_the_setting_is_refused() -> None:
    state = _state().configure(max_job_app_id_bytes=8)
    assert _block(state, "x" * 8, 1, 0).error == ErrorCode.none
    assert _block(state, "x" * 9, 1, 0) == Block(ErrorCode.invalid_request)
    assert _block(state, "é" * 5, 1, 0) == Block(ErrorCode.invalid_request)  # 10 bytes
    assert state.jobs.refusal("x" * 9, OWNER) == ErrorCode.invalid_request


def test_a_principal_holds_at_most_so_many_app_ids_until_one_expires() -> None:
    state = _state().configure(max_job_app_ids_per_principal=2)
    assert _block(state, "a", 1, 0).error == ErrorCode.none
    assert _block(state, "b", 1, 0, now_ms=DAY).error == ErrorCode.none
    written = state.next_offset
    assert _block(state, "c", 1, 0, now_ms=DAY) == Block(ErrorCode.policy_violation)
    assert state.next_offset == written
    # What it holds it may go on with, and others are not held back by it.
    assert _block(state, "a", 2, 0, now_ms=2 * DAY).error == ErrorCode.none
    assert _block(state, "b", 1, 1, now_ms=2 * DAY).error == ErrorCode.none
    assert _block(state, "z", 1, 0, principal=OTHER).error == ErrorCode.none
    assert state.jobs.apps.held_by(OWNER) == 2
    # "b" expires (its version is the oldest): room for one more.
    apply(state, state.jobs.expire(8 * DAY + 1, 8 * DAY + 1))
    assert state.jobs.apps.held_by(OWNER) == 1
    assert _block(state, "c", 1, 0, now_ms=8 * DAY + 1).error == ErrorCode.none


def test_a_fleet_controller_refuses_named_jobs() -> None:
    """Job records stay in one controller's log: a re-run reaching another controller of
    the fleet would get other blocks, so none is answered anywhere."""
    state = _state()
    replay(state, ProducerIdsLeased(0, 100_000, "etcd://x/p"))
    assert _block(state, "app", 1, 0) == Block(ErrorCode.invalid_request)
    unnamed = state.producer_ids.allocate_for_job(principal=OWNER, client_id="x")
    assert unnamed.response.error == ErrorCode.none


# -- clocks -------------------------------------------------------------------------------


def test_each_version_is_stamped_with_its_own_time() -> None:
    """A version recorded while the wall clock was far ahead dates no later version."""
    state = _state()
    state.jobs.start(DAY - 5, 0)  # started on time
    _block(state, "ahead", 1, 0, now_ms=400 * DAY, mono_ms=0)  # then set far ahead
    _block(state, "later", 1, 0, now_ms=DAY, mono_ms=5)  # and put right
    ahead, later = state.jobs.apps.get("ahead"), state.jobs.apps.get("later")
    assert ahead is not None and later is not None
    assert (ahead.allocated_ms, later.allocated_ms) == (400 * DAY, DAY)
    # The later version's window runs from its own stamp; the one stamped ahead has an
    # unknown age while the clock is behind it.
    assert _block(state, "later", 1, 0, now_ms=2 * DAY, mono_ms=20).error == ErrorCode.none
    assert _block(state, "later", 1, 0, now_ms=2 * DAY + 1, mono_ms=30) == Block(
        ErrorCode.unknown_producer_id
    )
    assert _block(state, "ahead", 1, 0, now_ms=2 * DAY, mono_ms=40) == Block(
        ErrorCode.unknown_producer_id
    )


def test_a_clock_set_back_while_running_does_not_shorten_an_age() -> None:
    """Job time never falls behind the monotonic clock's count: a version two days old by
    the monotonic clock is refused though the wall clock went back a day and a half."""
    state = _state()
    _block(state, "app", 1, 0, now_ms=10 * DAY, mono_ms=0)
    stepped_back = 10 * DAY + 2 * DAY - DAY - DAY // 2
    assert _block(state, "app", 1, 0, now_ms=stepped_back, mono_ms=2 * DAY) == Block(
        ErrorCode.unknown_producer_id
    )
    # A new version is stamped with job time (the monotonic count), not the stepped clock.
    _block(state, "new", 1, 0, now_ms=stepped_back, mono_ms=2 * DAY)
    new = state.jobs.apps.get("new")
    assert new is not None and new.allocated_ms == 12 * DAY


def test_a_clock_set_ahead_while_running_refuses_only_while_it_is_ahead() -> None:
    state = _state()
    _block(state, "app", 1, 0, now_ms=10 * DAY, mono_ms=0)
    assert _block(state, "app", 1, 0, now_ms=410 * DAY, mono_ms=1000) == Block(
        ErrorCode.unknown_producer_id
    )
    # Put right: the same blocks again (its age is the monotonic count).
    assert _block(state, "app", 1, 0, now_ms=10 * DAY + 2000, mono_ms=2000).error == (
        ErrorCode.none
    )


def test_a_restart_behind_the_newest_record_refuses_versions_recorded_before_it() -> None:
    """The wall clock went back while the controller was down (or the newest record was
    stamped ahead): the age of what was recorded before the restart is unknown until job
    time passes the newest record; what is recorded after is timed as usual."""
    state = _state()
    _block(state, "old", 1, 0, now_ms=10 * DAY)
    _block(state, "newest", 1, 0, now_ms=10 * DAY + 5000, mono_ms=10 * DAY + 5000)
    restarted = _restarted(state, wall_ms=10 * DAY + 1000, mono_ms=0)  # 4 s behind
    assert _block(restarted, "old", 1, 0, now_ms=10 * DAY + 1000, mono_ms=0) == Block(
        ErrorCode.unknown_producer_id
    )
    fresh = _block(restarted, "fresh", 1, 0, now_ms=10 * DAY + 1000, mono_ms=0)
    assert fresh.error == ErrorCode.none
    assert _block(restarted, "fresh", 1, 0, now_ms=10 * DAY + 1001, mono_ms=1) == fresh
    # Once job time has passed the newest record, ages are known again.
    passed = restarted.jobs.allocate(
        JobKey("old", 1, 0),
        wall_ms=10 * DAY + 6000,
        mono_ms=5000,
        principal=OWNER,
        client_id=None,
    )
    assert passed.response.error == ErrorCode.none


def test_a_restart_on_time_answers_versions_recorded_before_it() -> None:
    state = _state()
    first = _block(state, "app", 1, 0, now_ms=10 * DAY)
    restarted = _restarted(state, wall_ms=10 * DAY + 60_000)
    assert _block(restarted, "app", 1, 0, now_ms=10 * DAY + 60_000, mono_ms=0) == first
    # The downtime counts towards the reuse window: a day later it is refused.
    late = _restarted(state, wall_ms=11 * DAY + 1)
    refused = Block(ErrorCode.unknown_producer_id)
    assert _block(late, "app", 1, 0, now_ms=11 * DAY + 1, mono_ms=0) == refused


def test_expiry_counts_running_time_which_no_wall_clock_step_moves() -> None:
    state = _state()
    _block(state, "app", 1, 0, now_ms=DAY, mono_ms=0)
    # The wall clock 400 days ahead: nothing expires, the monotonic count says a minute.
    assert apply(state, state.jobs.expire(401 * DAY, 60_000)) == 0
    assert "app" in state.jobs.apps
    # Seven days and a bit of running time: it expires whatever the wall clock says.
    assert apply(state, state.jobs.expire(0, 7 * DAY + 1)) == 1
    assert "app" not in state.jobs.apps


def test_a_restart_goes_on_from_the_newest_running_time_recorded() -> None:
    """Downtime is not counted for expiry (an app id expires late, never early), and a
    clock record now and then keeps a restart from losing more than its interval."""
    state = _state()
    _block(state, "app", 1, 0, now_ms=DAY, mono_ms=0)
    result = state.jobs.expire(DAY + 3 * DAY, 3 * DAY)
    assert result.records == (JobClockAdvanced(DAY + 3 * DAY),)
    apply(state, result)
    assert state.jobs.expire(DAY + 3 * DAY + 1, 3 * DAY + 1).records == ()  # not yet again
    # A restart 30 wall days later: running time goes on from the record.
    restarted = _restarted(state, wall_ms=34 * DAY, mono_ms=0)
    assert apply(restarted, restarted.jobs.expire(34 * DAY, 4 * DAY - 2)) == 0
    assert apply(restarted, restarted.jobs.expire(34 * DAY, 4 * DAY)) == 1
    assert CLOCK_RECORD_INTERVAL_MS < DAY


def test_expiry_forgets_app_ids_in_steps() -> None:
    state = _state()
    for index in range(3):
        _block(state, f"app-{index}", 1, 0, now_ms=index * DAY)
    result = state.jobs.expire(9 * DAY + 1, 7 * DAY + DAY + 1, limit=1)
    assert result.response == 1 and isinstance(result.records[0], JobAllocationExpired)
    apply(state, result)
    assert apply(state, state.jobs.expire(9 * DAY + 1, 7 * DAY + DAY + 1, limit=5)) == 1
    assert list(state.jobs.apps) == ["app-2"]
    # Forgotten: the app id starts afresh, at any version.
    assert _block(state, "app-0", 0, 0, now_ms=9 * DAY).error == ErrorCode.none


# -- a damaged tail -----------------------------------------------------------------------


def test_after_a_damaged_tail_only_blocks_in_the_log_are_answered_for_a_while() -> None:
    """A version, or a block, whose record may have been in the lost tail is refused for
    the reuse window of running time, never answered with other blocks; what the log holds
    is answered as before."""
    state = _state()
    first = _block(state, "app", 1, 0, now_ms=DAY)
    restarted = _restarted(state, wall_ms=DAY + 10, mono_ms=0)
    apply(restarted, restarted.damaged_tail(100, DAY + 10, 0))
    unknown = Block(ErrorCode.unknown_producer_id)
    assert _block(restarted, "app", 1, 0, now_ms=DAY + 10, mono_ms=0) == first
    assert _block(restarted, "app", 1, 1, now_ms=DAY + 10, mono_ms=0) == unknown
    assert _block(restarted, "app", 2, 0, now_ms=DAY + 10, mono_ms=0) == unknown
    assert _block(restarted, "new", 1, 0, now_ms=DAY + 10, mono_ms=0) == unknown
    # The quarantine is in snapshots, and ends after the reuse window of running time.
    again = _restarted(restarted, wall_ms=DAY + 20, mono_ms=0)
    assert _block(again, "new", 1, 0, now_ms=DAY + 20, mono_ms=DAY - 10) == unknown
    assert _block(again, "new", 1, 0, now_ms=DAY + 30, mono_ms=DAY).error == ErrorCode.none


# -- replay and snapshots -----------------------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        JobBlockRecorded("app", 1, 2, 5000, 0, OWNER, 0),  # skips block 1
        JobBlockRecorded("app", 0, 0, 5000, 0, OWNER, 0),  # older version
        JobBlockRecorded("new", 1, 1, 5000, 0, OWNER, 0),  # a new version not at block 0
        JobAllocationExpired("app", 2),  # not its latest version
        JobAllocationExpired("nobody", 1),
    ],
)
def test_replay_refuses_records_that_break_the_order(
    record: JobBlockRecorded | JobAllocationExpired,
) -> None:
    state = _state()
    _block(state, "app", 1, 0)
    with pytest.raises(InvariantViolation):
        replay(state, record)


def test_a_snapshot_keeps_the_allocations_and_their_order() -> None:
    state = _state()
    _block(state, "b", 3, 0, now_ms=1)
    _block(state, "b", 3, 1, now_ms=2)
    _block(state, "a", 1, 0, now_ms=3, principal=OTHER)
    restored = through_snapshot(state)
    assert restored == state
    held = restored.jobs.apps.get("b")
    assert held is not None and held.blocks == [0, 1000] and held.owner == OWNER
    assert restored.jobs.apps.held_by(OTHER) == 1


def test_a_copy_for_a_snapshot_is_taken_without_copying_the_app_ids() -> None:
    """The copy shares the shards; a later change copies the one shard it changes, and the
    copy keeps what it was."""
    state = _state()
    for index in range(50):
        _block(state, f"app-{index}", 1, 0)
    copied = state.copy()
    assert all(
        mine is theirs
        for mine, theirs in zip(state.jobs.apps._shards, copied.jobs.apps._shards, strict=True)
    )
    _block(state, "app-7", 2, 0)
    _block(state, "late", 1, 0)
    held = copied.jobs.apps.get("app-7")
    assert held is not None and held.version == 1
    assert "late" not in copied.jobs.apps and "late" in state.jobs.apps
    shared = sum(
        mine is theirs
        for mine, theirs in zip(state.jobs.apps._shards, copied.jobs.apps._shards, strict=True)
    )
    assert shared >= len(state.jobs.apps._shards) - 2
    assert through_snapshot(copied) == copied


def test_a_key_may_carry_the_brokers_expiration_as_a_shorter_reuse_window() -> None:
    """A job that read the brokers' producer.id.expiration.ms sends it with its key: a
    re-run older than it is refused even inside reuse_ms (they forgot the first run's
    sequences), and the first run is answered as before."""
    key = JobKey("app", 3, 0, max_age_ms=3_600_000)
    assert key.client_id() == "pidctl-job/3/0~3600000/app"
    assert parse_job_key(key.client_id()) == key
    assert parse_job_key("pidctl-job/3/0/app") == JobKey("app", 3, 0)
    with pytest.raises(ValueError):
        parse_job_key("pidctl-job/3/0~x/app")
    state = _state()
    first = _block(state, "app", 3, 0, now_ms=0)

    def rerun(now_ms: int) -> Block:
        result = state.jobs.allocate(
            key, wall_ms=now_ms, mono_ms=now_ms, principal=OWNER, client_id=key.client_id()
        )
        return apply(state, result)

    assert rerun(3_600_000) == first
    assert rerun(3_600_001).error == ErrorCode.unknown_producer_id
    # Without the key's age the day's window holds.
    assert _block(state, "app", 3, 0, now_ms=3_600_001) == first
