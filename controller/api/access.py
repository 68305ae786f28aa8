"""What every handler is given before it decides: who is asking (:class:`ConnectionInfo`),
how much one request may ask for (:class:`RequestLimits`), and :class:`Access`: whether the
principal may (the authorizer) and whether grants may be made at all (paused)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pidctl.controller.core.acl import Authorizer
from pidctl.controller.core.kafka import CLUSTER_RESOURCE


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


#: Defaults of the request bounds (settings of the same names): what one request may ask
#: for, so that no request occupies the event loop for long or makes an answer without end.
#: About 50 µs of work per key or topic: a thousand keep one request near 50 ms.
DEFAULT_MAX_COORDINATOR_KEYS: Final = 1000
DEFAULT_MAX_METADATA_TOPICS: Final = 1000
#: Listeners, features and log directories in one BrokerRegistration, each.
DEFAULT_MAX_REGISTRATION_ENTRIES: Final = 1000


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """How much one request may ask for; more is answered INVALID_REQUEST at once."""

    max_coordinator_keys: int = DEFAULT_MAX_COORDINATOR_KEYS
    max_metadata_topics: int = DEFAULT_MAX_METADATA_TOPICS
    max_registration_entries: int = DEFAULT_MAX_REGISTRATION_ENTRIES


class Access:
    """May this principal do this, and may grants be made now: one for all the handlers,
    whose :attr:`authorizer` a reload replaces and whose :attr:`paused` the server sets."""

    def __init__(self, authorizer: Authorizer, on_paused: Callable[[str], None]) -> None:
        """``on_paused``: told of each request refused while grants are paused
        (:attr:`paused`): the API's name."""
        self.authorizer = authorizer
        #: Why grants are paused now, or None: the data dir's filesystem is nearly full
        #: (``server/free_space.py`` watches it), and a grant's record could meet ENOSPC,
        #: which stops the server. Meanwhile InitProducerId is answered COORDINATOR_LOAD_IN_PROGRESS
        #: and AllocateProducerIds KAFKA_STORAGE_ERROR (both retried by clients and
        #: brokers), and nothing is written.
        self.paused: str | None = None
        self.on_paused = on_paused

    def may(
        self,
        conn: ConnectionInfo,
        operation: str,
        resource_type: str = "Cluster",
        name: str = CLUSTER_RESOURCE,
    ) -> bool:
        """Whether ``conn``'s principal may do ``operation`` on the resource (the cluster
        unless named)."""
        authorizer = self.authorizer
        # (Without an authorizer every request may: asked on every request, so said here.)
        return not authorizer.enabled or authorizer.authorize(
            conn.principal, operation, resource_type, name, conn.host
        )

    def may_write_idempotently(self, conn: ConnectionInfo) -> bool:
        """What an idempotent producer needs, as Kafka asks it (KIP-679): IdempotentWrite on
        the cluster, or else Write on any topic."""
        authorizer = self.authorizer
        return self.may(conn, "IdempotentWrite") or authorizer.authorize_any(
            conn.principal, "Write", "Topic", conn.host
        )
