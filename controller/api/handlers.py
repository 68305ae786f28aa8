"""The controller's API handlers: Kafka's ``ControllerApis`` side of the
``ControllerApis`` / ``QuorumController`` line.

A handler authorises, calls one manager's decision, has :class:`QuorumController` apply its
result (``quorum.py``: the records replayed and appended) and builds the response from
``responses.py``; nothing else. The response may be sent once everything decided so far
is durable; an idempotent InitProducerId's once its PID's block's grant is
(``pool_grants.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from pidctl.controller.api.pool_grants import PoolGrants
from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.api.responses import (
    KAFKA_MESSAGES,
    NO_THROTTLE,
    NO_WAIT,
    REFUSALS,
    ApiVersionsAnswers,
    Reply,
    build_entity,
    first_listener,
    metadata_refusal,
    response_for,
    too_many_keys,
    too_many_topics,
)
from pidctl.controller.core.acl import APP_ID, Authorizer
from pidctl.controller.core.job_commits import parse_commit_key
from pidctl.controller.core.jobs import parse_job_key
from pidctl.controller.core.kafka import CLUSTER_RESOURCE
from pidctl.controller.core.logformat import RecordTooLarge
from pidctl.controller.core.producer_ids import (
    JOB_BROKER_EPOCH,
    JOB_BROKER_ID,
    LEASE_EXHAUSTED,
    Block,
)
from pidctl.controller.core.topics import (
    AUTHORIZED_OPERATIONS_NOT_REQUESTED,
    authorized_operations,
    invalid_topic_name,
    is_internal_topic,
    is_share_partition_key,
    java_hash_set_order,
    java_string_hash,
    java_uuid_hash,
)
from pidctl.controller.core.transactions import parse_expected
from pidctl.protocol.apis import (
    ApiKey,
    SupportedApis,
    entity_class,
    response_class,
    supported_apis,
)
from pidctl.protocol.block_requests import BlockRequested
from pidctl.protocol.codec import Request
from pidctl.protocol.headers import RequestHeader
from pidctl.protocol.init_requests import InitRequested

#: Versions served, per API: what Kafka 4.x serves, as far as kio has the schemas.
#: InitProducerId stops at v5: v6 is KIP-939's two-phase commit, which pidctl does not do.
SERVED_APIS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.METADATA: (0, 13),
    ApiKey.FIND_COORDINATOR: (0, 6),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.DESCRIBE_CLUSTER: (0, 2),
    # Answered by the connection (server/security/sasl_session.py), not by the controller.
    # SaslHandshake v0 (raw tokens after it) is gone from Kafka 4.0, and from pidctl.
    ApiKey.SASL_HANDSHAKE: (1, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.BROKER_REGISTRATION: (0, 4),
    ApiKey.BROKER_HEARTBEAT: (0, 2),
    ApiKey.UNREGISTER_BROKER: (0, 0),
    ApiKey.ALLOCATE_PRODUCER_IDS: (0, 0),
}

#: Error codes compared on every InitProducerId and AllocateProducerIds, looked up once: a
#: member read through its enum class costs ~120 ns (the metaclass is searched first).
_NO_ERROR = ErrorCode.none
_NO_PRODUCER_ID_YET = ErrorCode.coordinator_load_in_progress
_FENCED = ErrorCode.producer_fenced
_DENIED = ErrorCode.cluster_authorization_failed
_NO_BLOCK = (ErrorCode.unknown_server_error, LEASE_EXHAUSTED)
#: AllocateProducerIds refused before anything is decided: start 0 and length 0 (as Kafka).
_REFUSED_BLOCK = Block(ErrorCode.cluster_authorization_failed, 0, 0)
#: A named job without Write on its app id, as a transactional id without Write on it.
_APP_ID_DENIED = ErrorCode.transactional_id_authorization_failed
_INVALID_BLOCK = Block(ErrorCode.invalid_request, 0, 0)
#: AllocateProducerIds while grants are paused (the disk nearly full): Kafka's retriable
#: storage error.
_PAUSED_BLOCK = Block(ErrorCode.kafka_storage_error, 0, 0)

#: FindCoordinator key types Kafka defines: group, transaction, share group (KIP-932, from
#: v6 only).
_COORDINATOR_KEY_TYPES = (0, 1, 2)
_TRANSACTION_KEYS = 1
_SHARE_KEYS = 2
_FIRST_SHARE_VERSION = 6


def _topic_id(topic: Any) -> uuid.UUID | None:
    """A Metadata request topic's id, None for none (v0-v9) or the zero id (Kafka's "none")."""
    topic_id = getattr(topic, "topic_id", None)
    return topic_id if topic_id is not None and topic_id.int else None


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final (compiled rule 1)
class InitAnswer:
    """An InitProducerId's answer: the error, the producer id and epoch (-1, -1 with an
    error), the offset to be durable before it is sent, and the producer ids it created (1
    for a new PID, for the quota on them; else 0)."""

    error: Final[ErrorCode]
    producer_id: Final[int]
    producer_epoch: Final[int]
    durable_offset: Final[int]
    created: Final[int]

    def __init__(
        self,
        error: ErrorCode,
        producer_id: int = -1,
        producer_epoch: int = -1,
        durable_offset: int = NO_WAIT,
        created: int = 0,
    ) -> None:
        self.error = error
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.durable_offset = durable_offset
        self.created = created


_TRANSACTIONAL_ID_DENIED = InitAnswer(ErrorCode.transactional_id_authorization_failed)
_IDEMPOTENT_WRITE_DENIED = InitAnswer(ErrorCode.cluster_authorization_failed)
#: InitProducerId while grants are paused: the error every client retries.
_PAUSED_INIT = InitAnswer(ErrorCode.coordinator_load_in_progress)


class IdempotentRun(NamedTuple):
    """The answers to a run of idempotent InitProducerIds: a PID (epoch 0) for each of the
    first ``len(producer_ids)``, ``error`` for the rest; sent once ``durable_offset`` is."""

    producer_ids: Sequence[int]
    error: ErrorCode
    durable_offset: int


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who is asking, and through which listener: the principal is recorded in grants (the
    audit trail) and authorised; Metadata and FindCoordinator answer with the listener's
    advertised address."""

    principal: str = "User:ANONYMOUS"
    peer: str = ""
    host: str = "*"
    advertised_host: str = "127.0.0.1"
    advertised_port: int = 9093


Handler = Callable[["Controller", Request, Now, ConnectionInfo], Reply]

#: Defaults of the request bounds (settings of the same names): what one request may ask
#: for, so that no request occupies the event loop for long or makes an answer without end.
#: About 50 µs of work per key or topic: a thousand keep one request near 50 ms.
DEFAULT_MAX_COORDINATOR_KEYS = 1000
DEFAULT_MAX_METADATA_TOPICS = 1000
#: Listeners, features and log directories in one BrokerRegistration, each.
DEFAULT_MAX_REGISTRATION_ENTRIES = 1000


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """How much one request may ask for; more is answered INVALID_REQUEST at once."""

    max_coordinator_keys: int = DEFAULT_MAX_COORDINATOR_KEYS
    max_metadata_topics: int = DEFAULT_MAX_METADATA_TOPICS
    max_registration_entries: int = DEFAULT_MAX_REGISTRATION_ENTRIES


def _told_nobody(api: str, exhausted: bool) -> None:
    """No one is told of requests refused for want of a producer id."""


def _told_nobody_paused(api: str) -> None:
    """No one is told of requests refused while grants are paused."""


class Controller:
    """Answers requests: per API, authorise, decide (one manager), apply (the quorum
    controller), respond."""

    def __init__(
        self,
        quorum: QuorumController,
        *,
        pool_grants: PoolGrants,
        node_id: int = 1,
        authorizer: Authorizer | None = None,
        limits: RequestLimits | None = None,
        on_no_producer_id: Callable[[str, bool], None] | None = None,
        on_paused: Callable[[str], None] | None = None,
    ) -> None:
        """``on_no_producer_id``: told of each request refused for want of a producer id:
        the API's name, and whether the range is used up for good (an operator must widen
        it) rather than waiting for a lease or a block. ``on_paused``: told of each request
        refused while grants are paused (:attr:`paused`): the API's name."""
        #: The managers, for their decisions (read and decided here; changed only by apply).
        self.state = quorum.state
        self.node_id = node_id
        self.limits = limits or RequestLimits()
        self.authorizer = authorizer or Authorizer()
        # Bound once: every request that writes calls it.
        self._apply = quorum.apply
        #: What an idempotent InitProducerId's answer waits for (its block's grant): one of
        #: the quorum controller's observers (``pool_grants.for_pool``).
        self._pool_grants = pool_grants
        self.on_no_producer_id = on_no_producer_id or _told_nobody
        #: Why grants are paused now, or None: the data dir's filesystem is nearly full
        #: (``server/free_space.py`` watches it), and a grant's record could meet ENOSPC,
        #: which stops the server. Meanwhile InitProducerId is answered COORDINATOR_LOAD_IN_PROGRESS
        #: and AllocateProducerIds KAFKA_STORAGE_ERROR (both retried by clients and
        #: brokers), and nothing is written.
        self.paused: str | None = None
        self.on_paused = on_paused or _told_nobody_paused
        self.supported: SupportedApis = supported_apis(SERVED_APIS)
        self.api_versions = ApiVersionsAnswers(self.supported)
        self._handlers: dict[int, Handler] = {
            ApiKey.API_VERSIONS: Controller._api_versions,
            ApiKey.BROKER_REGISTRATION: Controller._broker_registration,
            ApiKey.BROKER_HEARTBEAT: Controller._broker_heartbeat,
            ApiKey.UNREGISTER_BROKER: Controller._unregister_broker,
            ApiKey.METADATA: Controller._metadata,
            ApiKey.FIND_COORDINATOR: Controller._find_coordinator,
            ApiKey.DESCRIBE_CLUSTER: Controller._describe_cluster,
        }

    def handle(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        """Decide one request of an API kio reads (InitProducerId and AllocateProducerIds
        come as their own values, whichever reader read them: :meth:`init_producer_id`,
        :meth:`allocate_producer_ids`). The caller sends ``reply.body`` once
        ``durable_offset`` is.

        A request whose record would be too large for the log to read back is answered
        INVALID_REQUEST, and nothing is written."""
        try:
            return self._handlers[request.api_key](self, request, now, conn)
        except RecordTooLarge:
            refusal = REFUSALS[request.api_key]
            return Reply(response_for(request, error_code=ErrorCode.invalid_request, **refusal))

    @property
    def entry_limits(self) -> dict[int, int]:
        """Per API key, the most entries its array may hold (``protocol.codec.ENTRY_ARRAYS``):
        for the connections, which refuse a longer one before decoding it."""
        limits = self.limits
        return {
            ApiKey.FIND_COORDINATOR: limits.max_coordinator_keys,
            ApiKey.METADATA: limits.max_metadata_topics,
        }

    def refuse_oversized(self, header: RequestHeader, entries: int, limit: int) -> Reply:
        """The answer to a request whose array holds more than ``limit`` entries, built from
        its header alone (the array was never decoded): INVALID_REQUEST as that API says it."""
        request = Request(header, None)
        if header.api_key == ApiKey.METADATA:
            return Reply(too_many_topics(request, entries, limit))
        if header.api_key == ApiKey.FIND_COORDINATOR:
            return Reply(too_many_keys(request, entries, limit))
        raise ValueError(f"API key {header.api_key} has no array limit")

    def _may(
        self,
        conn: ConnectionInfo,
        operation: str,
        resource_type: str = "Cluster",
        name: str = CLUSTER_RESOURCE,
    ) -> bool:
        authorizer = self.authorizer
        # (Without an authorizer every request may: asked on every request, so said here.)
        return not authorizer.enabled or authorizer.authorize(
            conn.principal, operation, resource_type, name, conn.host
        )

    def _may_write_idempotently(self, conn: ConnectionInfo) -> bool:
        """What an idempotent producer needs, as Kafka asks it (KIP-679): IdempotentWrite on
        the cluster, or else Write on any topic."""
        authorizer = self.authorizer
        return self._may(conn, "IdempotentWrite") or authorizer.authorize_any(
            conn.principal, "Write", "Topic", conn.host
        )

    # -- handlers ---------------------------------------------------------------------------

    def _api_versions(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        return self.api_versions.reply(request)  # (no ACL: every client asks it first)

    def _broker_registration(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        body = request.body
        if not self._may(conn, "ClusterAction"):
            error = ErrorCode.cluster_authorization_failed
            return Reply(response_for(request, error_code=error, broker_epoch=i64(-1)))
        most = max(len(body.listeners), len(body.features), len(getattr(body, "log_dirs", ())))
        if body.incarnation_id is None or most > self.limits.max_registration_entries:
            return Reply(
                response_for(request, error_code=ErrorCode.invalid_request, broker_epoch=i64(-1))
            )
        result = self.state.cluster.register(
            broker_id=body.broker_id,
            cluster_id=body.cluster_id,
            incarnation_id=str(body.incarnation_id),
            rack=body.rack,
            listeners=tuple(f"{lst.name}://{lst.host}:{lst.port}" for lst in body.listeners),
            now_ms=now.mono_ms,
            next_offset=self.state.next_offset,
            migrating_zk_broker=getattr(body, "is_migrating_zk_broker", False),
        )
        registered, offset = self._apply(result, now)
        response = response_for(
            request, error_code=registered.error, broker_epoch=i64(registered.broker_epoch)
        )
        return Reply(response, offset)

    def _broker_heartbeat(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        body = request.body
        if not self._may(conn, "ClusterAction"):
            error = ErrorCode.cluster_authorization_failed
            return Reply(response_for(request, error_code=error, should_shut_down=False))
        result = self.state.cluster.heartbeat(
            broker_id=body.broker_id,
            broker_epoch=body.broker_epoch,
            want_fence=body.want_fence,
            want_shut_down=body.want_shut_down,
            now_ms=now.mono_ms,
        )
        beat, offset = self._apply(result, now)
        response = response_for(
            request,
            error_code=beat.error,
            is_caught_up=beat.error == ErrorCode.none,
            is_fenced=beat.is_fenced,
            should_shut_down=beat.should_shut_down,
        )
        return Reply(response, offset)

    def _unregister_broker(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        if not self._may(conn, "Alter"):  # Kafka: Alter on the cluster for this one
            error = ErrorCode.cluster_authorization_failed
            return Reply(
                response_for(
                    request, error_code=error, error_message="Alter on the cluster is needed"
                )
            )
        broker_id = request.body.broker_id
        error, offset = self._apply(self.state.cluster.unregister(broker_id), now)
        # Kafka's messages: empty on success (the field's default), its exception's text.
        message = (
            "" if error == ErrorCode.none else f"Broker ID {broker_id} is not currently registered"
        )
        return Reply(response_for(request, error_code=error, error_message=message), offset)

    def allocate_producer_ids(
        self, request: BlockRequested, now: Now, conn: ConnectionInfo
    ) -> tuple[Block, int, int]:
        """AllocateProducerIds' handler, whichever reader read the request (``struct`` or
        kio: ``protocol.block_requests``): the block (or refusal), the offset that must be
        durable before it is answered, and the producer ids it created for a job (a new job
        block's 1,000, for the quota on new producer ids; 0 for a broker's block, which is
        the cluster's, and for a job's block answered again). The connection packs the
        answer."""
        broker_id, broker_epoch = request.broker_id, request.broker_epoch
        client_id = request.client_id
        manager = self.state.producer_ids
        # A job (BrokerId -1, BrokerEpoch -1) is a producer that hands PIDs to its own
        # tasks: it needs what InitProducerId needs, not the brokers' ClusterAction: an
        # idempotent producer's IdempotentWrite (or Write on a topic), or for a named job
        # (app id, version, block in the client id, controller/core/jobs.py) what a
        # transactional id needs, Write on its app id, which it must also own.
        job = broker_id == JOB_BROKER_ID and broker_epoch == JOB_BROKER_EPOCH
        # (No record of it can be too large: a client id is at most 32,767 bytes, an app id
        # at most max_job_app_id_bytes.)
        key = commit = None
        if job:
            try:
                commit = parse_commit_key(client_id)
                key = None if commit is not None else parse_job_key(client_id)
            except ValueError:
                return _INVALID_BLOCK, NO_WAIT, 0
            if commit is not None:
                # A named job's version completed (core/job_commits.py): recorded for the
                # app id's owner, as its blocks are.
                refused = self.app_id_refusal(conn, commit.app_id)
                if refused:
                    return Block(refused, 0, 0), NO_WAIT, 0
            elif key is not None:
                refused = self.app_id_refusal(conn, key.app_id)
                if refused:
                    return Block(refused, 0, 0), NO_WAIT, 0
                committed = self.state.commits.committed_block(key.app_id, key.version, key.block)
                if committed is not None:  # a re-run of a completed version writes nothing
                    return committed, NO_WAIT, 0
            elif not self._may_write_idempotently(conn):
                return _REFUSED_BLOCK, NO_WAIT, 0
        elif not self._may(conn, "ClusterAction"):
            return _REFUSED_BLOCK, NO_WAIT, 0
        if self.paused is not None:
            self.on_paused("AllocateProducerIds")
            return _PAUSED_BLOCK, NO_WAIT, 0
        if commit is not None:
            done, offset = self._apply(
                self.state.commits.commit(commit, principal=conn.principal), now
            )
            return done, offset, 0
        if key is not None:
            result = self.state.jobs.allocate(
                key,
                wall_ms=now.wall_ms,
                mono_ms=now.mono_ms,
                principal=conn.principal,
                client_id=client_id,
            )
        elif job:
            result = manager.allocate_for_job(principal=conn.principal, client_id=client_id)
        else:
            result = manager.allocate(
                broker_id=broker_id,
                broker_epoch=broker_epoch,
                principal=conn.principal,
                client_id=client_id,
            )
        block, offset = self._apply(result, now)
        if block.error in _NO_BLOCK:
            self.on_no_producer_id("AllocateProducerIds", manager.exhausted())
        # A job's block is new when it was recorded now (one answered again writes nothing).
        created = block.length if job and result.records else 0
        return block, offset, created

    def app_id_refusal(
        self, conn: ConnectionInfo, app_id: str, operation: str = "Write"
    ) -> ErrorCode:
        """May this connection's principal act on the job app id ``app_id``? ErrorCode.none
        if so; else the Kafka error to answer, nothing decided: INVALID_REQUEST for an app
        id longer than ``max_job_app_id_bytes``; TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        without an ACL allowing ``operation`` on it (resource type ``AppId``, literal or
        prefixed, as a TransactionalId), or when another principal owns it (the one that
        recorded its latest version). For every request that names an app id."""
        if not self._may(conn, operation, APP_ID, app_id):
            return _APP_ID_DENIED
        return self.state.jobs.refusal(app_id, conn.principal)

    def init_producer_id(
        self, request: InitRequested, now: Now, conn: ConnectionInfo
    ) -> InitAnswer:
        """InitProducerId's handler: the answer at the request's version, whichever reader
        read it (``struct`` or kio: ``protocol.init_requests``); an idempotent one is
        decided as a run of one (:meth:`init_idempotent_run`, which decides the runs
        ``protocol.idempotent_inits`` reads). The connection packs the answer."""
        transactional_id = request.transactional_id
        if transactional_id is not None:
            if not self._may(conn, "Write", "TransactionalId", transactional_id):
                return _TRANSACTIONAL_ID_DENIED
        elif not self._may_write_idempotently(conn):
            return _IDEMPOTENT_WRITE_DENIED
        if self.paused is not None:
            self.on_paused("InitProducerId")
            return _PAUSED_INIT
        expected = parse_expected(request.producer_id, request.producer_epoch)
        if isinstance(expected, ErrorCode):
            return InitAnswer(expected)
        if transactional_id is None:
            # The timeout is not looked at (clients send -1, 0, 60000 or 2^31-1).
            pids, error, offset = self._idempotent_run(1, now)
            if not pids:
                return InitAnswer(error, durable_offset=offset)
            return InitAnswer(_NO_ERROR, pids[0], 0, offset, 1)
        transactions = self.state.transactions
        held = transactions.transactional_ids.producer_id_of(transactional_id)
        # (No record of it can be too large: init_transactional refuses a transactional id
        # over MAX_TRANSACTIONAL_ID_BYTES, INVALID_REQUEST.)
        result = transactions.init_transactional(
            transactional_id,
            timeout_ms=request.timeout_ms,
            expected=expected,
            now_ms=now.wall_ms,
        )
        answer, offset = self._apply(result, now)
        error = answer.error
        if error == _NO_PRODUCER_ID_YET:
            self.on_no_producer_id("InitProducerId", self.state.producer_ids.exhausted())
        if error == _FENCED and request.api_version < 4:
            error = ErrorCode.invalid_producer_epoch  # what clients before v4 understand
        if error:
            return InitAnswer(error, durable_offset=offset)
        created = 1 if answer.producer_id != held else 0
        return InitAnswer(error, answer.producer_id, answer.producer_epoch, offset, created)

    def init_idempotent_run(self, count: int, now: Now, conn: ConnectionInfo) -> IdempotentRun:
        """``count`` idempotent InitProducerIds in a row, from one connection (read by
        ``protocol.idempotent_inits``): decided as that many :meth:`init_producer_id` calls
        would decide them, without a request or response value each. The PIDs go to the
        first requests in order; the rest are answered ``error``."""
        if not self._may_write_idempotently(conn):
            return IdempotentRun([], _DENIED, NO_WAIT)
        if self.paused is not None:
            for _ in range(count):
                self.on_paused("InitProducerId")
            return IdempotentRun([], _NO_PRODUCER_ID_YET, NO_WAIT)
        return self._idempotent_run(count, now)

    def _idempotent_run(self, count: int, now: Now) -> IdempotentRun:
        """Every idempotent InitProducerId's decision, authorised: :meth:`init_idempotent_run`."""
        transactions, apply = self.state.transactions, self._apply
        taken, offset = apply(transactions.init_idempotent_run(count), now)
        if len(taken) == count:  # (nearly always: the run fits before the next refill)
            return IdempotentRun(taken, _NO_PRODUCER_ID_YET, self._wait_for(taken, offset))
        pids = list(taken)
        while taken and len(pids) < count:
            taken, offset = apply(transactions.init_idempotent_run(count - len(pids)), now)
            pids += taken
        if len(pids) < count:
            exhausted = self.state.producer_ids.exhausted()
            for _ in range(count - len(pids)):
                self.on_no_producer_id("InitProducerId", exhausted)
        return IdempotentRun(pids, _NO_PRODUCER_ID_YET, self._wait_for(pids, offset))

    def _wait_for(self, pids: Sequence[int], offset: int) -> int:
        """The offset idempotent answers with ``pids`` wait for: the grant of the last one's
        block (``pool_grants.py``); ``offset``, everything decided so far, with none."""
        return self._pool_grants.offset_of(pids[-1], offset) if pids else offset

    def _metadata(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        """This node is the only broker and the controller; it hosts no topics. Each topic
        asked for is answered as Kafka's KafkaApis.handleTopicMetadataRequest answers one
        that does not exist (no topic is created, whatever the request allows)."""
        version, cls = request.api_version, response_class(request.api_key, request.api_version)
        asked = request.body.topics or ()
        if len(asked) > self.limits.max_metadata_topics:
            return Reply(too_many_topics(request, len(asked), self.limits.max_metadata_topics))
        if version < 12 and any(t.name is None or _topic_id(t) for t in asked):
            # (Kafka: InvalidRequestException, "Topic IDs are not supported in requests for
            # version ..." or "Topic name can not be null for version ...".)
            return Reply(metadata_refusal(request, ErrorCode.invalid_request))
        ids = [i for i in map(_topic_id, asked) if i is not None]
        if not ids and any(t.name is None for t in asked):
            # Neither a name nor an id: Kafka fails on it (kept-on-purpose table).
            return Reply(metadata_refusal(request, ErrorCode.invalid_request))
        topic_entry = entity_class(cls, "topics")
        topics: list[Any] = []
        if ids:
            # Named by id (v12+): the names are not looked at, as in Kafka.
            for topic_id in java_hash_set_order(ids, java_uuid_hash):
                topics.append(
                    build_entity(
                        topic_entry,
                        error_code=ErrorCode.unknown_topic_id,
                        name=None,
                        topic_id=topic_id,
                        is_internal=False,
                        partitions=(),
                    )
                )
        else:
            topics = self._unknown_topics(request, conn, topic_entry, [t.name for t in asked])
        cluster_operations = AUTHORIZED_OPERATIONS_NOT_REQUESTED
        if 8 <= version <= 10 and request.body.include_cluster_authorized_operations:
            cluster_operations = (
                authorized_operations(
                    self.authorizer, conn.principal, conn.host, "Cluster", CLUSTER_RESOURCE
                )
                if self._may(conn, "Describe")
                else 0
            )
        broker = build_entity(
            entity_class(cls, "brokers"),
            node_id=i32(self.node_id),
            host=conn.advertised_host,
            port=i32(conn.advertised_port),
            rack=None,
        )
        body = build_entity(
            cls,
            throttle_time=NO_THROTTLE,
            brokers=(broker,),
            cluster_id=self.state.cluster_id,
            controller_id=i32(self.node_id),
            topics=tuple(topics),
            cluster_authorized_operations=i32(cluster_operations),
            error_code=ErrorCode.none,  # v13+ (KIP-1102): a top-level error
        )
        return Reply(body)

    def _unknown_topics(
        self, request: Request, conn: ConnectionInfo, entry: Any, names: list[str]
    ) -> list[Any]:
        """The entries of topics named that do not exist, in Kafka's order (its set's):
        those the principal may Describe (INVALID_TOPIC_EXCEPTION for a name Kafka's
        Topic.validate refuses, else UNKNOWN_TOPIC_OR_PARTITION; marked internal if Kafka's
        own; with the operations allowed on it if asked for), then, when creation is allowed,
        those it may not create (TOPIC_AUTHORIZATION_FAILED), then those it may not Describe
        (TOPIC_AUTHORIZATION_FAILED whether they exist or not: nothing leaks)."""
        with_operations = request.api_version >= 8 and getattr(
            request.body, "include_topic_authorized_operations", False
        )
        allowed: list[Any] = []
        denied: list[Any] = []
        not_creatable: list[Any] = []
        # Creation allowed (always below v4): Kafka then needs Create on the cluster or the
        # topic before it looks at the name, and refuses the others as unauthorized.
        creating = getattr(request.body, "allow_auto_topic_creation", True)
        may_create_any = not creating or self._may(conn, "Create")
        for name in java_hash_set_order(names, java_string_hash):
            if not self._may(conn, "Describe", "Topic", name):
                denied.append(
                    build_entity(
                        entry,
                        error_code=ErrorCode.topic_authorization_failed,
                        name=name,
                        topic_id=None,
                        is_internal=False,
                        partitions=(),
                    )
                )
                continue
            if not may_create_any and not self._may(conn, "Create", "Topic", name):
                not_creatable.append(
                    build_entity(
                        entry,
                        error_code=ErrorCode.topic_authorization_failed,
                        name=name,
                        topic_id=None,
                        is_internal=is_internal_topic(name),
                        partitions=(),
                    )
                )
                continue
            error = ErrorCode.unknown_topic_or_partition
            if invalid_topic_name(name) is not None:
                error = ErrorCode.invalid_topic_exception
            operations = AUTHORIZED_OPERATIONS_NOT_REQUESTED
            if with_operations:
                operations = authorized_operations(
                    self.authorizer, conn.principal, conn.host, "Topic", name
                )
            allowed.append(
                build_entity(
                    entry,
                    error_code=error,
                    name=name,
                    topic_id=None,
                    is_internal=is_internal_topic(name),
                    partitions=(),
                    topic_authorized_operations=i32(operations),
                )
            )
        return allowed + not_creatable + denied

    def _describe_cluster(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        """The brokers registered with this controller (endpoint type 1), or this controller
        itself (type 2, KIP-919). Fenced brokers are listed from v2 only if asked for."""
        body, cls = request.body, response_class(request.api_key, request.api_version)
        entry = entity_class(cls, "brokers")
        endpoint_type = getattr(body, "endpoint_type", 1)
        common = {
            "throttle_time": NO_THROTTLE,
            "endpoint_type": endpoint_type,
            "cluster_authorized_operations": i32(-(2**31)),
        }
        if not self._may(conn, "Describe"):
            return Reply(
                build_entity(
                    cls,
                    **common,
                    error_code=ErrorCode.cluster_authorization_failed,
                    error_message=None,
                    cluster_id="",
                    controller_id=i32(-1),
                    brokers=(),
                )
            )
        cluster = self.state.cluster
        listed = []
        if endpoint_type == 2:
            listed.append(
                build_entity(
                    entry,
                    broker_id=i32(self.node_id),
                    host=conn.advertised_host,
                    port=i32(conn.advertised_port),
                    rack=None,
                    is_fenced=False,
                )
            )
        elif endpoint_type == 1:
            include_fenced = getattr(body, "include_fenced_brokers", False)
            for registration in sorted(cluster.brokers.values(), key=lambda b: b.broker_id):
                fenced = cluster.is_fenced(registration.broker_id, now.mono_ms)
                if fenced and not include_fenced and request.api_version >= 2:
                    continue
                host, port = first_listener(registration.listeners)
                listed.append(
                    build_entity(
                        entry,
                        broker_id=i32(registration.broker_id),
                        host=host,
                        port=i32(port),
                        rack=registration.rack,
                        is_fenced=fenced,
                    )
                )
        error = ErrorCode.none if endpoint_type in (1, 2) else ErrorCode.unsupported_endpoint_type
        response = build_entity(
            cls,
            **common,
            error_code=error,
            error_message=None if not error else f"unknown endpoint type {endpoint_type}",
            cluster_id=cluster.cluster_id or "",
            controller_id=i32(self.node_id),
            brokers=tuple(listed),
        )
        return Reply(response)

    def _find_coordinator(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        """This node coordinates every group and transactional id."""
        body, version = request.body, request.api_version
        cls = response_class(request.api_key, version)
        key_type = getattr(body, "key_type", 0)

        # The answer for a key is one of a few, built once per request (a request may carry
        # a thousand keys): this node, or one error. Messages as Kafka's: v1-v3 carry the
        # error's own (Errors.message(), "NONE" for none), v4+ an empty one.
        batched = version >= 4
        found = {
            "error_code": ErrorCode.none,
            "error_message": "" if batched else "NONE",
            "node_id": i32(self.node_id),
            "host": conn.advertised_host,
            "port": i32(conn.advertised_port),
        }
        refused = {"node_id": i32(-1), "host": "", "port": i32(-1)}
        unknown_type = {
            **refused,
            "error_code": ErrorCode.invalid_request,
            "error_message": f"unknown key type {key_type}",
        }
        resource, denied = (
            ("TransactionalId", ErrorCode.transactional_id_authorization_failed)
            if key_type == _TRANSACTION_KEYS
            else ("Group", ErrorCode.group_authorization_failed)
        )
        not_allowed = {
            **refused,
            "error_code": denied,
            "error_message": "" if batched else KAFKA_MESSAGES[denied],
        }
        # Share groups (KIP-932): pidctl has no share coordinator. Kafka refuses the key type
        # below v6, and a key that is not group:topicId:partition; a well-formed key is
        # answered as Kafka answers one while its share coordinator is not available.
        share_refused = {**refused, "error_code": ErrorCode.invalid_request, "error_message": ""}
        share_unavailable = {**share_refused, "error_code": ErrorCode.coordinator_not_available}
        if not batched:
            share_refused["error_message"] = KAFKA_MESSAGES[ErrorCode.invalid_request]

        def answer(key: str) -> dict[str, Any]:
            if key_type not in _COORDINATOR_KEY_TYPES:
                return unknown_type
            if key_type == _SHARE_KEYS:
                if version < _FIRST_SHARE_VERSION or not is_share_partition_key(key):
                    return share_refused
                return share_unavailable
            if not self._may(conn, "Describe", resource, key):
                return not_allowed
            return found

        if key_type == _SHARE_KEYS and version >= _FIRST_SHARE_VERSION:
            keys = body.coordinator_keys
            if keys and not self._may(conn, "ClusterAction"):
                # Kafka checks ClusterAction on the cluster at the first share key and fails
                # the whole request: every key CLUSTER_AUTHORIZATION_FAILED.
                error = ErrorCode.cluster_authorization_failed
                entry = entity_class(cls, "coordinators")
                coordinators = tuple(
                    entry(key=key, **refused, error_code=error, error_message=KAFKA_MESSAGES[error])
                    for key in keys
                )
                return Reply(
                    build_entity(cls, throttle_time=NO_THROTTLE, coordinators=coordinators)
                )

        if version >= 4:
            entry = entity_class(cls, "coordinators")
            keys, most = body.coordinator_keys, self.limits.max_coordinator_keys
            if len(keys) > most:
                return Reply(too_many_keys(request, len(keys), most))
            coordinators = tuple(entry(key=key, **answer(key)) for key in keys)
            return Reply(build_entity(cls, throttle_time=NO_THROTTLE, coordinators=coordinators))
        return Reply(build_entity(cls, throttle_time=NO_THROTTLE, **answer(body.key)))
