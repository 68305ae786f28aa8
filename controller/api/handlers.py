"""The controller's API handlers: Kafka's ``ControllerApis`` side of the
``ControllerApis`` / ``QuorumController`` line.

A handler authorises, calls one manager's decision, has :class:`QuorumController` apply its
result (``quorum.py``: the records replayed and appended) and builds the response from
``responses.py``; nothing else. The response may be sent once everything decided so far
is durable; an idempotent InitProducerId's once its PID's block's grant is
(``pool_grants.py``).

One handler per API, in the module of its APIs: InitProducerId (``init_producer_id.py``),
AllocateProducerIds (``allocate_producer_ids.py``), the brokers' (``cluster_apis.py``),
Metadata and FindCoordinator (``metadata_apis.py``); ApiVersions here. :class:`Controller`
builds them around one :class:`~pidctl.controller.api.access.Access` and dispatches the
APIs kio reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from kio.schema.errors import ErrorCode

from pidctl.controller.api.access import Access, ConnectionInfo, RequestLimits
from pidctl.controller.api.allocate_producer_ids import AllocateProducerIdsHandler
from pidctl.controller.api.cluster_apis import ClusterApis
from pidctl.controller.api.init_producer_id import InitProducerIdHandler
from pidctl.controller.api.metadata_apis import MetadataApis
from pidctl.controller.api.pool_grants import PoolGrants
from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.api.responses import (
    REFUSALS,
    ApiVersionsAnswers,
    Reply,
    response_for,
    too_many_keys,
    too_many_topics,
)
from pidctl.controller.core.acl import Authorizer
from pidctl.controller.core.logformat import RecordTooLarge
from pidctl.protocol.apis import ApiKey, SupportedApis, supported_apis
from pidctl.protocol.codec import Request
from pidctl.protocol.headers import RequestHeader

#: Versions served, per API: what Kafka 4.x serves, as far as kio has the schemas.
#: InitProducerId stops at v5: v6 is KIP-939's two-phase commit, which pidctl does not do.
SERVED_APIS: Final[dict[ApiKey, tuple[int, int]]] = {
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

Handler = Callable[[Request, Now, ConnectionInfo], Reply]


def _told_nobody(api: str, exhausted: bool) -> None:
    """No one is told of requests refused for want of a producer id."""


def _told_nobody_paused(api: str) -> None:
    """No one is told of requests refused while grants are paused."""


class Controller:
    """Answers requests: per API, authorise, decide (one manager), apply (the quorum
    controller), respond. Builds the handlers, one per API, and dispatches the APIs kio
    reads (:meth:`handle`); InitProducerId and AllocateProducerIds, which come as values of
    their own, go to their handlers (:attr:`inits`, :attr:`allocations`) directly."""

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
        #: The managers' state, what the handlers read (changed only by the quorum's apply).
        self.state = quorum.state
        self.limits = limits = limits or RequestLimits()
        #: The authorizer and the pause, one for every handler.
        self.access = access = Access(authorizer or Authorizer(), on_paused or _told_nobody_paused)
        told = on_no_producer_id or _told_nobody
        # Not observing, the pool's grants would never say a block is durable: every
        # idempotent answer would wait for a commit of its own.
        assert pool_grants.applied in quorum.observers, "pool_grants must observe the quorum"
        #: The handlers of the APIs read as values of their own, for the connections. An
        #: idempotent InitProducerId's answer waits for its block's grant (``pool_grants``:
        #: one of the quorum controller's observers, ``pool_grants.for_pool``).
        self.inits = InitProducerIdHandler(quorum, access, pool_grants, told)
        self.allocations = AllocateProducerIdsHandler(quorum, access, told)
        self.supported: SupportedApis = supported_apis(SERVED_APIS)
        self.api_versions = ApiVersionsAnswers(self.supported)
        cluster = ClusterApis(quorum, access, node_id, limits)
        metadata = MetadataApis(self.state, access, node_id, limits)
        self._handlers: dict[int, Handler] = {
            ApiKey.API_VERSIONS: self._api_versions,
            ApiKey.BROKER_REGISTRATION: cluster.broker_registration,
            ApiKey.BROKER_HEARTBEAT: cluster.broker_heartbeat,
            ApiKey.UNREGISTER_BROKER: cluster.unregister_broker,
            ApiKey.METADATA: metadata.metadata,
            ApiKey.FIND_COORDINATOR: metadata.find_coordinator,
            ApiKey.DESCRIBE_CLUSTER: cluster.describe_cluster,
        }

    @property
    def authorizer(self) -> Authorizer:
        """The authorizer every handler asks (a reload replaces it)."""
        return self.access.authorizer

    @authorizer.setter
    def authorizer(self, authorizer: Authorizer) -> None:
        self.access.authorizer = authorizer

    @property
    def paused(self) -> str | None:
        """Why grants are paused now, or None (:attr:`Access.paused`)."""
        return self.access.paused

    @paused.setter
    def paused(self, reason: str | None) -> None:
        self.access.paused = reason

    def handle(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        """Decide one request of an API kio reads (InitProducerId and AllocateProducerIds
        come as their own values, whichever reader read them: :attr:`inits`,
        :attr:`allocations`). The caller sends ``reply.body`` once ``durable_offset`` is.

        A request whose record would be too large for the log to read back is answered
        INVALID_REQUEST, and nothing is written."""
        try:
            return self._handlers[request.api_key](request, now, conn)
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

    def _api_versions(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        return self.api_versions.reply(request)  # (no ACL: every client asks it first)
