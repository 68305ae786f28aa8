"""Request builders for tests: kio entities with sensible defaults."""

from __future__ import annotations

import uuid

from kio.schema.allocate_producer_ids.v0 import AllocateProducerIdsRequest
from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest
from kio.schema.types import BrokerId
from kio.schema.unregister_broker.v0 import UnregisterBrokerRequest
from kio.static.primitive import i64

from controller.client import SyncClient


def registration(
    broker_id: int, cluster_id: str, incarnation: uuid.UUID | None = None
) -> BrokerRegistrationRequest:
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
    return BrokerHeartbeatRequest(
        broker_id=BrokerId(broker_id),
        broker_epoch=i64(epoch),
        current_metadata_offset=i64(0),
        want_fence=want_fence,
        want_shut_down=want_shut_down,
    )


def allocate(broker_id: int, epoch: int) -> AllocateProducerIdsRequest:
    return AllocateProducerIdsRequest(broker_id=BrokerId(broker_id), broker_epoch=i64(epoch))


def unregister(broker_id: int) -> UnregisterBrokerRequest:
    return UnregisterBrokerRequest(broker_id=BrokerId(broker_id))


def cluster_id_of(data_dir: object) -> str:
    """The cluster id the server stored as its first record."""
    from pathlib import Path

    from controller.metalog import read_log

    contents = read_log(Path(str(data_dir)))
    if contents.snapshot_state is not None:
        return str(contents.snapshot_state["cluster_id"])
    first = contents.entries()[0].record
    return str(first.cluster_id)  # type: ignore[union-attr]


def register(client: SyncClient, broker_id: int, cluster_id: str) -> int:
    response = client.request(registration(broker_id, cluster_id))
    assert response.error_code == 0, response
    return int(response.broker_epoch)
