"""The handlers' own rules (authorisation, bounds, version differences, refusals that write
nothing), decided against an in-memory log: no server process needed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4 import FindCoordinatorRequest
from kio.static.primitive import i8

from pidctl.controller.api.access import ConnectionInfo, RequestLimits
from pidctl.controller.api.handlers import Controller
from pidctl.controller.api.pool_grants import for_pool
from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.core.acl import Acl, Authorizer
from pidctl.controller.core.producer_ids import ProducerIdRange
from pidctl.controller.core.state import ControllerState
from pidctl.protocol import requests
from pidctl.protocol.apis import ApiKey
from pidctl.protocol.block_requests import BlockRequested, block_request_of
from pidctl.protocol.codec import Request, TooManyEntries, decode_request, encode_request
from pidctl.protocol.headers import client_id_of
from pidctl.protocol.init_requests import InitRequested, init_request_of
from tests.controller.memory_log import MemoryLog

NOW = Now(1_000, 1_000)


def _controller(
    authorizer: Authorizer | None = None,
    log: MemoryLog | None = None,
    *,
    on_no_producer_id: Callable[[str, bool], None] | None = None,
    on_paused: Callable[[str], None] | None = None,
    **limits: int,
) -> Controller:
    state = ControllerState()
    pool_grants = for_pool(state)
    quorum = QuorumController(state, MemoryLog() if log is None else log, (pool_grants.applied,))
    controller = Controller(
        quorum,
        pool_grants=pool_grants,
        authorizer=authorizer,
        limits=RequestLimits(**limits),
        on_no_producer_id=on_no_producer_id,
        on_paused=on_paused,
    )
    quorum.apply(quorum.state.cluster.create_cluster("c", 1), NOW)
    return controller


def _handle(controller: Controller, body: Any, principal: str = "User:ANONYMOUS") -> Any:
    """The answer's fields, from the API's one handler (as the connection calls it)."""
    request: Request = decode_request(encode_request(body, 7, "t")[4:], controller.supported)
    conn = ConnectionInfo(principal=principal)
    if request.api_key == ApiKey.INIT_PRODUCER_ID:
        init = controller.inits.init_producer_id(init_request_of(request), NOW, conn)
        return SimpleNamespace(
            error_code=init.error, producer_id=init.producer_id, producer_epoch=init.producer_epoch
        )
    if request.api_key == ApiKey.ALLOCATE_PRODUCER_IDS:
        block, _, _ = controller.allocations.allocate_producer_ids(
            block_request_of(request), NOW, conn
        )
        return SimpleNamespace(
            error_code=block.error, producer_id_start=block.first, producer_id_len=block.length
        )
    return controller.handle(request, NOW, conn).body


def _allocate(
    controller: Controller,
    client_id: str | None,
    principal: str = "User:ANONYMOUS",
    broker_id: int = -1,
) -> Any:
    """A job's block (broker id and epoch -1) asked with ``client_id``, through the handler
    (or a broker's, given its ``broker_id``): the block, its offset, the PIDs it created."""
    request = BlockRequested(7, client_id, broker_id, -1)
    return controller.allocations.allocate_producer_ids(
        request, NOW, ConnectionInfo(principal=principal)
    )


def test_allocation_needs_cluster_action_and_a_job_needs_idempotent_write() -> None:
    acls = [Acl("User:producer", "IdempotentWrite", "Cluster", "kafka-cluster")]
    controller = _controller(Authorizer(acls, enabled=True))
    refused = _handle(controller, requests.allocate(1, 1), "User:producer")
    assert (refused.error_code, refused.producer_id_start, refused.producer_id_len) == (31, 0, 0)
    job = _handle(controller, requests.allocate(-1, -1), "User:producer")
    assert (job.error_code, job.producer_id_start, job.producer_id_len) == (0, 0, 1000)
    assert _handle(controller, requests.allocate(-1, -1), "User:other").error_code == 31


def test_transactional_ids_need_write_on_the_id() -> None:
    acls = [Acl("User:p", "Write", "TransactionalId", "app-", "prefixed")]
    controller = _controller(Authorizer(acls, enabled=True))
    assert _handle(controller, requests.init_producer_id("app-1"), "User:p").error_code == 0
    denied = _handle(controller, requests.init_producer_id("other"), "User:p")
    assert (denied.error_code, denied.producer_id) == (53, -1)
    assert _handle(controller, requests.init_producer_id(), "User:p").error_code == 31


@pytest.mark.parametrize(("version", "error"), [(3, 47), (4, 90), (5, 90)])
def test_a_fenced_producer_hears_what_its_version_understands(version: int, error: int) -> None:
    controller = _controller()
    first = _handle(controller, requests.init_producer_id("tx"))
    _handle(controller, requests.init_producer_id("tx"))  # epoch 1 fences epoch 0
    stale = requests.init_producer_id(
        "tx", producer_id=first.producer_id, producer_epoch=5, version=version
    )
    assert _handle(controller, stale).error_code == error


def test_a_transactional_id_too_long_to_log_is_refused_and_nothing_written() -> None:
    log = MemoryLog()
    controller = _controller(log=log)
    before = len(log.entries)
    answer = _handle(controller, requests.init_producer_id("\x01" * 40_000))
    assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (42, -1, -1)
    assert len(log.entries) == before
    assert _handle(controller, requests.init_producer_id()).producer_id == 0  # pool untouched


def test_a_registration_whose_record_would_be_too_large_is_refused() -> None:
    log = MemoryLog()
    controller = _controller(log=log)
    listeners = tuple(f"L{i}://{'h' * 2000}:{i}" for i in range(900))
    answer = _handle(controller, requests.registration(1, "c", listeners=listeners))
    assert (answer.error_code, answer.broker_epoch) == (42, -1)
    assert len(log.entries) == 1  # ClusterCreated only


def test_registration_entries_are_bounded() -> None:
    controller = _controller(max_registration_entries=2)
    many = ("A://h:1", "B://h:2", "C://h:3")
    assert _handle(controller, requests.registration(1, "c", listeners=many)).error_code == 42
    assert _handle(controller, requests.registration(1, "c", listeners=many[:2])).error_code == 0


def test_find_coordinator_keys_are_bounded_with_one_entry_saying_why() -> None:
    controller = _controller(max_coordinator_keys=2)
    answer = _handle(
        controller, FindCoordinatorRequest(key_type=i8(1), coordinator_keys=("a",) * 3)
    )
    (entry,) = answer.coordinators
    assert entry.error_code == 42 and "at most 2 (max_coordinator_keys)" in entry.error_message


@pytest.mark.parametrize(
    ("version", "found", "denied"),
    [(1, "NONE", "Transactional Id"), (3, "NONE", "Transactional Id"), (4, "", ""), (6, "", "")],
)
def test_find_coordinator_messages_are_kafkas(version: int, found: str, denied: str) -> None:
    # Kafka (4.4) answers v1-v3 with its error's message, "NONE" for none, and v4+ with an
    # empty one (tests/ops/testing/test_conformance.py compares with its recorded answers).
    acls = [Acl("User:p", "Describe", "TransactionalId", "app-", "prefixed")]
    controller = _controller(Authorizer(acls, enabled=True))

    def message(key: str) -> str:
        answer = _handle(controller, requests.find_coordinator(key, version=version), "User:p")
        entry = answer.coordinators[0] if version >= 4 else answer
        return str(entry.error_message)

    assert message("app-1") == found
    assert message("other").startswith(denied)


def test_unregister_broker_messages_are_kafkas() -> None:
    controller = _controller()
    assert _handle(controller, requests.registration(4, "c")).error_code == 0
    done = _handle(controller, requests.unregister(4))
    assert (done.error_code, done.error_message) == (0, "")
    again = _handle(controller, requests.unregister(4))
    assert (again.error_code, again.error_message) == (
        102,
        "Broker ID 4 is not currently registered",
    )


@pytest.mark.parametrize("version", [0, 4, 12, 13])
def test_metadata_topics_need_describe(version: int) -> None:
    # As Kafka: a topic the principal may not Describe is TOPIC_AUTHORIZATION_FAILED, whether
    # it exists or not; without an authorizer every topic is simply unknown.
    acls = [
        Acl("User:p", "Describe", "Topic", "app-", "prefixed"),
        Acl("User:p", "Create", "Cluster", "kafka-cluster"),  # below v4 creation is asked for
    ]
    controller = _controller(Authorizer(acls, enabled=True))
    answer = _handle(controller, requests.metadata(["app-1", "other"], version=version), "User:p")
    assert [(t.name, t.error_code) for t in answer.topics] == [("app-1", 3), ("other", 29)]
    open_controller = _controller()
    answer = _handle(open_controller, requests.metadata(["other"], version=version), "User:p")
    assert [t.error_code for t in answer.topics] == [3]


@pytest.mark.parametrize("version", [1, 4, 12])
def test_metadata_creation_allowed_needs_create_as_in_kafka(version: int) -> None:
    # Kafka (auto.create.topics.enable, the default): creation allowed (always below v4),
    # a topic the principal may Describe but not Create, on the cluster or the topic, is
    # TOPIC_AUTHORIZATION_FAILED, listed after the others it may Describe.
    acls = [
        Acl("User:p", "Describe", "Topic", "*"),
        Acl("User:p", "Create", "Topic", "mine"),
    ]
    controller = _controller(Authorizer(acls, enabled=True))
    body = requests.metadata(["theirs", "mine"], version=version)
    if version >= 4:
        body = dataclasses.replace(body, allow_auto_topic_creation=True)
    answer = _handle(controller, body, "User:p")
    assert [(t.name, t.error_code) for t in answer.topics] == [("mine", 3), ("theirs", 29)]
    if version >= 4:  # not asked to create: only Describe counts
        body = dataclasses.replace(body, allow_auto_topic_creation=False)
        answer = _handle(controller, body, "User:p")
        assert [t.error_code for t in answer.topics] == [3, 3]


def test_metadata_authorized_operations_follow_the_acls() -> None:
    acls = [
        Acl("User:p", "Read", "Topic", "t"),
        Acl("User:p", "Describe", "Cluster", "kafka-cluster"),
    ]
    controller = _controller(Authorizer(acls, enabled=True))
    body = dataclasses.replace(
        requests.metadata(["t"], version=10),
        include_topic_authorized_operations=True,
        include_cluster_authorized_operations=True,
    )
    answer = _handle(controller, body, "User:p")
    assert answer.topics[0].topic_authorized_operations == 1 << 3 | 1 << 8  # Read, Describe
    assert answer.cluster_authorized_operations == 1 << 8
    answer = _handle(controller, body, "User:q")
    assert answer.topics[0].error_code == 29 and answer.cluster_authorized_operations == 0


@pytest.mark.parametrize("version", [0, 9, 12, 13])
def test_metadata_topics_are_bounded(version: int) -> None:
    controller = _controller(max_metadata_topics=2)
    answer = _handle(controller, requests.metadata(["a", "b", "c"], version=version))
    if version >= 13:
        assert answer.error_code == 42 and answer.topics == ()
    else:
        assert [t.error_code for t in answer.topics] == [42]
    within = _handle(controller, requests.metadata(["a", "b"], version=version))
    assert [t.error_code for t in within.topics] == [3, 3]  # UNKNOWN_TOPIC_OR_PARTITION


@pytest.mark.parametrize(
    "body",
    [
        FindCoordinatorRequest(key_type=i8(1), coordinator_keys=("a",) * 3),
        *(requests.metadata(["a", "b", "c"], version=v) for v in (0, 9, 12, 13)),
    ],
    ids=["find_coordinator", "metadata-v0", "metadata-v9", "metadata-v12", "metadata-v13"],
)
def test_an_array_refused_before_decoding_gets_the_answer_of_one_refused_after(body: Any) -> None:
    controller = _controller(max_coordinator_keys=2, max_metadata_topics=2)
    frame = encode_request(body, 7, "t")[4:]
    with pytest.raises(TooManyEntries) as refused:
        decode_request(frame, controller.supported, controller.entry_limits)
    error = refused.value
    assert (error.entries, error.limit) == (3, 2)
    early = controller.refuse_oversized(error.header, error.entries, error.limit).body
    assert early == _handle(controller, body)  # the same answer as the handler's own check


def _told(calls: list[tuple[str, bool]], api: str, exhausted: bool) -> None:
    calls.append((api, exhausted))


def test_an_idempotent_answer_waits_for_its_blocks_grant_not_for_the_prefetch() -> None:
    """The prefetch (at 90 % of a block) is decided before the answer that set it off, but
    that answer's PID comes from the block before, durable long ago: it waits for that
    block's grant only. The first PID of the prefetched block waits for its grant."""
    controller, conn = _controller(), ConnectionInfo()
    first = controller.inits.init_idempotent_run(900, NOW, conn)
    first_grant = first.durable_offset
    assert list(first.producer_ids) == list(range(900))
    assert first_grant == controller.state.next_offset - 1  # the grant of block 0, just made
    at_threshold = controller.inits.init_idempotent_run(1, NOW, conn)
    prefetch = controller.state.next_offset - 1
    assert list(at_threshold.producer_ids) == [900] and prefetch > first_grant
    assert at_threshold.durable_offset == first_grant
    over = controller.inits.init_idempotent_run(100, NOW, conn)
    assert list(over.producer_ids) == list(range(901, 1001))
    assert over.durable_offset == prefetch  # PID 1000 is the prefetched block's
    request = InitRequested(5, 7, "t", None, 60_000, -1, -1)
    alone = controller.inits.init_producer_id(request, NOW, conn)
    assert (alone.producer_id, alone.durable_offset) == (1001, prefetch)


@settings(max_examples=60, deadline=None)
@given(
    runs=st.lists(st.integers(1, 700), min_size=1, max_size=8),
    blocks=st.integers(1, 4),
    denied=st.booleans(),
)
def test_a_run_of_idempotent_inits_is_decided_as_each_one_alone(
    runs: list[int], blocks: int, denied: bool
) -> None:
    """``init_idempotent_run`` against the same requests one by one through
    ``init_producer_id`` (as a request kio read comes):
    the same PIDs, the same refusals (a range of ``blocks`` blocks runs dry, so 14 comes;
    without IdempotentWrite, 31), the same records in the log, the same offsets to wait for
    and the same calls of ``on_no_producer_id``."""
    acls = [Acl("User:p", "IdempotentWrite", "Cluster", "kafka-cluster")]
    authorizer = Authorizer(acls, enabled=True)
    principal = "User:other" if denied else "User:p"
    logs = MemoryLog(), MemoryLog()
    refusals: tuple[list[tuple[str, bool]], list[tuple[str, bool]]] = ([], [])
    one, many = (
        _controller(authorizer, log, on_no_producer_id=partial(_told, calls))
        for log, calls in zip(logs, refusals, strict=True)
    )
    for controller in (one, many):
        controller.state.producer_ids.pid_range = ProducerIdRange(0, 1000 * blocks - 1)
    conn = ConnectionInfo(principal=principal)
    for count in runs:
        request = init_request_of(
            decode_request(
                encode_request(requests.init_producer_id(None), 7, "t")[4:], one.supported
            )
        )
        alone = [one.inits.init_producer_id(request, NOW, conn) for _ in range(count)]
        run = many.inits.init_idempotent_run(count, NOW, conn)
        answers = [(r.error, r.producer_id, r.producer_epoch) for r in alone]
        refused = count - len(run.producer_ids)
        assert answers == [(0, pid, 0) for pid in run.producer_ids] + [(run.error, -1, -1)] * (
            refused
        )
        assert run.durable_offset == max(r.durable_offset for r in alone)
    assert logs[0].entries == logs[1].entries
    assert refusals[0] == refusals[1]


def test_a_job_key_read_from_bytes_that_are_not_utf8_is_answered_invalid_request() -> None:
    """The client id of such a request is read with U+FFFD (``headers.client_id_of``, as
    Kafka reads it); as a job's name it could stand for another app's: refused, nothing
    written."""
    controller = _controller()
    written = controller.state.next_offset
    block, _, created = _allocate(controller, client_id_of(b"pidctl-job/1/0/app-\xff"))
    assert (block.error, block.first, block.length, created) == (
        ErrorCode.invalid_request,
        0,
        0,
        0,
    )
    assert controller.state.next_offset == written
    named, _, created = _allocate(controller, "pidctl-job/1/0/app-x")
    assert (named.error, created) == (ErrorCode.none, 1000)
    # The same block asked again (a re-run) is answered as recorded: no new producer ids.
    again, _, created = _allocate(controller, "pidctl-job/1/0/app-x")
    assert (again.first, created) == (named.first, 0)


def test_while_grants_are_paused_every_grant_is_refused_retriably_and_nothing_written() -> None:
    """The data dir's filesystem below data_dir_min_free_bytes (server/app.py sets it):
    InitProducerId COORDINATOR_LOAD_IN_PROGRESS, AllocateProducerIds KAFKA_STORAGE_ERROR."""
    refused: list[str] = []
    controller = _controller(on_paused=refused.append)
    controller.paused = "1.0 MiB free on the data dir's filesystem"
    written = controller.state.next_offset
    conn = ConnectionInfo()
    idempotent = InitRequested(5, 7, "t", None, 60_000, -1, -1)
    init = controller.inits.init_producer_id(idempotent, NOW, conn)
    assert init.error == ErrorCode.coordinator_load_in_progress
    tx = controller.inits.init_producer_id(
        InitRequested(5, 7, "t", "tx", 60_000, -1, -1), NOW, conn
    )
    assert tx.error == ErrorCode.coordinator_load_in_progress
    run = controller.inits.init_idempotent_run(3, NOW, conn)
    assert (list(run.producer_ids), run.error) == ([], ErrorCode.coordinator_load_in_progress)
    for broker_id in (-1, 1):
        block, _, created = _allocate(controller, None, broker_id=broker_id)
        assert (block.error, block.length, created) == (ErrorCode.kafka_storage_error, 0, 0)
    assert controller.state.next_offset == written
    assert refused == ["InitProducerId"] * 5 + ["AllocateProducerIds"] * 2
    controller.paused = None  # room again: granted
    assert controller.inits.init_producer_id(idempotent, NOW, conn).error == 0


def _named(controller: Controller, app: str, version: int, block: int, principal: str) -> Any:
    """A named job's block, through the handler, as ``principal``."""
    key = f"pidctl-job/{version}/{block}/{app}"
    answer, _, _ = _allocate(controller, key, principal)
    return answer


def test_a_named_job_needs_write_on_its_app_id_as_a_transactional_id_does() -> None:
    """Literal and prefixed ACLs on the AppId resource, a DENY beating an ALLOW; refused
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53), and nothing written. IdempotentWrite on the
    cluster (every idempotent producer's) is not enough for a name."""
    acls = [
        Acl("User:etl", "Write", "AppId", "etl-", "prefixed"),
        Acl("User:etl", "Write", "AppId", "etl-secret", "literal", "deny"),
        Acl("User:etl", "IdempotentWrite", "Cluster", "kafka-cluster"),
        Acl("User:adhoc", "IdempotentWrite", "Cluster", "kafka-cluster"),
        Acl("User:any", "Write", "AppId", "*"),
    ]
    controller = _controller(Authorizer(acls, enabled=True))
    written = controller.state.next_offset
    for app, principal in [
        ("other", "User:etl"),
        ("etl-secret", "User:etl"),
        ("etl-a", "User:adhoc"),
    ]:
        assert _named(controller, app, 1, 0, principal).error == 53, (app, principal)
    assert controller.state.next_offset == written
    assert _named(controller, "etl-a", 1, 0, "User:etl").error == 0
    assert _named(controller, "anything", 1, 0, "User:any").error == 0
    # Without a name, a job still needs only IdempotentWrite.
    unnamed, _, _ = _allocate(controller, "x", "User:adhoc")
    assert unnamed.error == 0


def test_an_app_id_is_answered_and_fenced_only_for_its_owner() -> None:
    """Two principals both allowed every app id: the second can neither read the first's
    blocks, share its version, nor fence it; nothing it asks is written."""
    acls = [Acl("User:*", "Write", "AppId", "*")]
    controller = _controller(Authorizer(acls, enabled=True))
    first = _named(controller, "orders", 5, 0, "User:owner")
    written = controller.state.next_offset
    for version, block in [(5, 0), (5, 1), (6, 0), (2**63 - 1, 0)]:
        assert _named(controller, "orders", version, block, "User:intruder").error == 53
    assert controller.state.next_offset == written
    assert (
        controller.allocations.app_id_refusal(ConnectionInfo(principal="User:intruder"), "orders")
        == 53
    )
    assert (
        controller.allocations.app_id_refusal(ConnectionInfo(principal="User:owner"), "orders") == 0
    )
    again = _named(controller, "orders", 5, 0, "User:owner")
    assert (again.error, again.first) == (0, first.first)


def test_app_id_bounds_are_kafka_errors_and_write_nothing() -> None:
    controller = _controller()
    controller.state.configure(max_job_app_id_bytes=10, max_job_app_ids_per_principal=1)
    written = controller.state.next_offset
    assert _named(controller, "x" * 11, 1, 0, "User:p").error == ErrorCode.invalid_request
    assert _named(controller, "a", 1, 0, "User:p").error == 0
    written = controller.state.next_offset
    assert _named(controller, "b", 1, 0, "User:p").error == ErrorCode.policy_violation
    assert controller.state.next_offset == written


def test_a_grant_record_keeps_at_most_so_much_of_a_client_id() -> None:
    log = MemoryLog()
    controller = _controller(log=log)
    huge = "c" * 32_000
    block, _, _ = _allocate(controller, huge)
    assert block.error == 0
    assert max(len(entry) for entry in log.entries) < 600


def test_the_authorizer_and_the_pause_set_on_the_controller_reach_every_handler() -> None:
    """A reload sets ``Controller.authorizer`` and the disk watch ``Controller.paused``
    (server/app.py): each handler, whichever module it is in, asks the new one."""
    controller = _controller()
    conn = ConnectionInfo(principal="User:p")
    idempotent = InitRequested(5, 7, "t", None, 60_000, -1, -1)
    assert controller.inits.init_producer_id(idempotent, NOW, conn).error == 0
    controller.authorizer = Authorizer([], enabled=True)  # no ACL: nothing allowed
    assert controller.access.authorizer is controller.authorizer
    denied = ErrorCode.cluster_authorization_failed
    assert controller.inits.init_producer_id(idempotent, NOW, conn).error == denied
    assert controller.inits.init_idempotent_run(2, NOW, conn).error == denied
    block, _, _ = _allocate(controller, None, "User:p", broker_id=1)
    assert block.error == denied
    assert _handle(controller, requests.describe_cluster(), "User:p").error_code == denied
    controller.authorizer = Authorizer()
    controller.paused = "1.0 MiB free"
    assert controller.access.paused == "1.0 MiB free"
    paused = controller.inits.init_producer_id(idempotent, NOW, conn)
    assert paused.error == ErrorCode.coordinator_load_in_progress
