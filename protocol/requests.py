"""Builders for the requests pidctl's own tools send, with Kafka's defaults filled in."""

from __future__ import annotations

import uuid

from kio.schema.allocate_producer_ids.v0 import AllocateProducerIdsRequest
from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest
from kio.schema.types import BrokerId
from kio.schema.unregister_broker.v0 import UnregisterBrokerRequest
from kio.static.primitive import i64


def registration(
    broker_id: int, cluster_id: str, incarnation: uuid.UUID | None = None
) -> BrokerRegistrationRequest:
    """A BrokerRegistration v4 with no listeners or features (a new incarnation by default)."""
    return BrokerRegistrationRequest(
        broker_id=BrokerId(broker_id),
        cluster_id=cluster_id,
        incarnation_id=incarnation or uuid.uuid4(),
        listeners=(),
        features=(),
        rack=None,
    )


def heartbeat(
    broker_id: int, epoch: int, *, want_fence: bool = False, want_shut_down: bool = False
) -> BrokerHeartbeatRequest:
    """A BrokerHeartbeat v2 for ``broker_id`` at ``epoch``."""
    return BrokerHeartbeatRequest(
        broker_id=BrokerId(broker_id),
        broker_epoch=i64(epoch),
        current_metadata_offset=i64(0),
        want_fence=want_fence,
        want_shut_down=want_shut_down,
    )


def allocate(broker_id: int, epoch: int) -> AllocateProducerIdsRequest:
    """An AllocateProducerIds v0 (the request carries no size: blocks are always 1000)."""
    return AllocateProducerIdsRequest(broker_id=BrokerId(broker_id), broker_epoch=i64(epoch))


def unregister(broker_id: int) -> UnregisterBrokerRequest:
    """An UnregisterBroker v0."""
    return UnregisterBrokerRequest(broker_id=BrokerId(broker_id))
