"""Builders for the requests pidctl's own tools send, with Kafka's defaults filled in."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from kio.schema.allocate_producer_ids.v0 import AllocateProducerIdsRequest
from kio.schema.broker_heartbeat.v2 import BrokerHeartbeatRequest
from kio.schema.broker_registration.v4 import BrokerRegistrationRequest
from kio.schema.broker_registration.v4.request import Listener
from kio.schema.types import BrokerId
from kio.schema.unregister_broker.v0 import UnregisterBrokerRequest
from kio.static.primitive import i8, i16, i64, u16

from pidctl.protocol.addresses import parse_listener
from pidctl.protocol.apis import ApiKey, entity_class, request_class


def registration(
    broker_id: int,
    cluster_id: str,
    incarnation: uuid.UUID | None = None,
    *,
    listeners: tuple[str, ...] = (),
    rack: str | None = None,
) -> BrokerRegistrationRequest:
    """A BrokerRegistration v4 (a new incarnation by default); ``listeners`` are
    ``NAME://HOST:PORT`` strings, as in Kafka's ``advertised.listeners``."""
    return BrokerRegistrationRequest(
        broker_id=BrokerId(broker_id),
        cluster_id=cluster_id,
        incarnation_id=incarnation or uuid.uuid4(),
        listeners=tuple(_listener(text) for text in listeners),
        features=(),
        rack=rack,
    )


def _listener(text: str) -> Listener:
    name, address = parse_listener(text)
    # Security protocol ids (Kafka's SecurityProtocol): PLAINTEXT 0, SSL 1, SASL_PLAINTEXT 2,
    # SASL_SSL 3; a listener named after one uses it, any other name is PLAINTEXT.
    protocols = {"PLAINTEXT": 0, "SSL": 1, "SASL_PLAINTEXT": 2, "SASL_SSL": 3}
    return Listener(
        name=name,
        host=address.host,
        port=u16(address.port),
        security_protocol=i16(protocols.get(name.upper(), 0)),
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


def init_producer_id(
    transactional_id: str | None = None,
    timeout_ms: int = 60_000,
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    version: int = 5,
) -> Any:
    """An InitProducerId at ``version``; (producer_id, producer_epoch) exist from v3 (KIP-360)."""
    cls: Any = request_class(ApiKey.INIT_PRODUCER_ID, version)
    fields: dict[str, Any] = {
        "transactional_id": transactional_id,
        "transaction_timeout": datetime.timedelta(milliseconds=timeout_ms),
    }
    if version >= 3:
        fields["producer_id"] = i64(producer_id)
        fields["producer_epoch"] = i16(producer_epoch)
    return cls(**fields)


def find_coordinator(key: str, key_type: int = 1, *, version: int = 6) -> Any:
    """A FindCoordinator for one key (a list of keys from v4); key type 1 is transaction."""
    cls: Any = request_class(ApiKey.FIND_COORDINATOR, version)
    if version >= 4:
        return cls(key_type=i8(key_type), coordinator_keys=(key,))
    if version >= 1:
        return cls(key=key, key_type=i8(key_type))
    return cls(key=key)


def metadata(topics: list[str] | None = None, *, version: int = 12) -> Any:
    """A Metadata request; ``None`` asks for all topics (v1+), as clients do at start."""
    cls: Any = request_class(ApiKey.METADATA, version)
    topic_cls = entity_class(cls, "topics")
    entries = None
    if topics is not None:
        entries = tuple(
            topic_cls(name=t, topic_id=None) if version >= 10 else topic_cls(name=t) for t in topics
        )
    if version == 0:
        entries = entries or ()
    fields: dict[str, Any] = {"topics": entries}
    if version >= 4:
        fields["allow_auto_topic_creation"] = False
    if version >= 8:
        fields["include_topic_authorized_operations"] = False
    if 8 <= version <= 10:
        fields["include_cluster_authorized_operations"] = False
    return cls(**fields)


def describe_cluster(*, include_fenced_brokers: bool = True, endpoint_type: int = 1) -> Any:
    """A DescribeCluster v2 (registered brokers, fenced ones too by default)."""
    cls: Any = request_class(ApiKey.DESCRIBE_CLUSTER, 2)
    return cls(
        include_cluster_authorized_operations=False,
        endpoint_type=i8(endpoint_type),
        include_fenced_brokers=include_fenced_brokers,
    )


def api_versions() -> Any:
    """An ApiVersions v3 naming this software (KIP-511)."""
    cls: Any = request_class(ApiKey.API_VERSIONS, 3)
    from pidctl.protocol import __version__

    return cls(client_software_name="pidctl", client_software_version=__version__)


def sasl_handshake(mechanism: str) -> Any:
    """A SaslHandshake v1 (SaslAuthenticate requests carry the tokens after it)."""
    cls: Any = request_class(ApiKey.SASL_HANDSHAKE, 1)
    return cls(mechanism=mechanism)


def sasl_authenticate(token: bytes) -> Any:
    """A SaslAuthenticate v2 carrying one SASL token."""
    cls: Any = request_class(ApiKey.SASL_AUTHENTICATE, 2)
    return cls(auth_bytes=token)
