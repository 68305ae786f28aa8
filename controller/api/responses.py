"""Building the answers: kio response entities for the API version asked, the refusals
each API answers with, and the :class:`Reply` a handler returns (the response, and the
offset that must be durable before it is sent)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import uuid
from typing import Any, Final, NamedTuple

from kio.schema.errors import ErrorCode
from kio.static.primitive import i16, i32, i64

from pidctl.protocol.addresses import parse_listener
from pidctl.protocol.api_versions import (
    build_api_versions_response,
    has_valid_client_software,
    invalid_request_response,
)
from pidctl.protocol.apis import (
    ApiKey,
    SupportedApis,
    entity_class,
    response_class,
)
from pidctl.protocol.codec import Request, encode_response_body

NO_WAIT: Final = -1


class Reply(NamedTuple):
    """A response, and the log offset that must be durable before it is sent."""

    body: Any
    durable_offset: int = NO_WAIT
    #: The body's bytes when it was encoded ahead (:class:`ApiVersionsAnswers`), for the
    #: connection to frame as they are unless it changes the body (a throttle); None: the
    #: body is encoded when sent.
    encoded: bytes | None = None


class ApiVersionsAnswers:
    """The ApiVersions answers, each built and encoded once: the same for every connection
    asking at one version (every connection's first request), and ~100 µs to build and as
    much to encode. The server's only cache of them: one per served version, valid or not
    (KIP-511's client software check), at most twice the versions served."""

    __slots__ = ("_replies", "supported")

    def __init__(self, supported: SupportedApis) -> None:
        self.supported = supported
        self._replies: dict[tuple[int, bool], Reply] = {}

    def reply(self, request: Request) -> Reply:
        """The answer to an ApiVersions request (at a version served: the codec answers the
        others), its body's bytes with it."""
        valid = has_valid_client_software(request.body)
        key = (request.api_version, valid)
        reply = self._replies.get(key)
        if reply is None:
            version = request.api_version
            if valid:
                body = build_api_versions_response(version, self.supported)
            else:
                body = invalid_request_response(version)
            reply = self._replies[key] = Reply(body, encoded=encode_response_body(body))
        return reply


NO_THROTTLE: Final = datetime.timedelta(0)
#: Kafka's messages of the errors pidctl answers with Kafka's wording (Errors.java).
KAFKA_MESSAGES: Final = {
    ErrorCode.transactional_id_authorization_failed: "Transactional Id authorization failed.",
    ErrorCode.group_authorization_failed: "Group authorization failed.",
    ErrorCode.cluster_authorization_failed: "Cluster authorization failed.",
    ErrorCode.invalid_request: (
        "This most likely occurs because of a request being malformed by the client library "
        "or the message was sent to an incompatible broker. See the broker logs for more "
        "details."
    ),
}
#: The rest of an error answer, per API that writes records.
REFUSALS: Final[dict[int, dict[str, Any]]] = {
    ApiKey.BROKER_REGISTRATION: {"broker_epoch": i64(-1)},
    ApiKey.UNREGISTER_BROKER: {"error_message": "record too large"},
    ApiKey.ALLOCATE_PRODUCER_IDS: {"producer_id_start": i64(0), "producer_id_len": i32(0)},
    ApiKey.INIT_PRODUCER_ID: {"producer_id": i64(-1), "producer_epoch": i16(-1)},
}


#: The error of a request refused by a strict quota (core/quotas.py), per API that takes
#: one; the connection's answerer of its kind packs it with the throttle time.
#: AllocateProducerIds: THROTTLING_QUOTA_EXCEEDED, as KIP-599's controller mutation quota
#: refuses (a broker backs off and retries on any error). InitProducerId:
#: COORDINATOR_LOAD_IN_PROGRESS, which every client retries, where Kafka's Java producer
#: fails for good on any error it does not expect there, THROTTLING_QUOTA_EXCEEDED too
#: (TransactionManager's InitProducerIdHandler).
QUOTA_REFUSALS: Final[dict[int, ErrorCode]] = {
    ApiKey.ALLOCATE_PRODUCER_IDS: ErrorCode.throttling_quota_exceeded,
    ApiKey.INIT_PRODUCER_ID: ErrorCode.coordinator_load_in_progress,
}


def too_many_keys(request: Request, asked: int, most: int) -> Any:
    """FindCoordinator (v4+) asking for more keys than allowed: one entry says why, whatever
    was asked, so the answer stays small."""
    cls: Any = response_class(request.api_key, request.api_version)
    refusal = entity_class(cls, "coordinators")(
        key="",
        error_code=ErrorCode.invalid_request,
        error_message=f"{asked} keys in one request; at most {most} (max_coordinator_keys)",
        node_id=i32(-1),
        host="",
        port=i32(-1),
    )
    return build_entity(cls, throttle_time=NO_THROTTLE, coordinators=(refusal,))


def topic_without_partitions(
    entity: Any, error: ErrorCode, name: str | None, topic_id: Any, internal: bool = False
) -> Any:
    """A Metadata topic entry with no partitions: a topic refused, unknown or not created."""
    return build_entity(
        entity,
        error_code=error,
        name=name,
        topic_id=topic_id,
        is_internal=internal,
        partitions=(),
    )


def _metadata_refused(cls: Any, topics: tuple[Any, ...], error: ErrorCode) -> Any:
    """A Metadata answer that refuses: no brokers, no cluster, ``topics`` as given, and
    ``error`` at the top level (v13+ only)."""
    return build_entity(
        cls,
        throttle_time=NO_THROTTLE,
        brokers=(),
        cluster_id=None,
        controller_id=i32(-1),
        topics=topics,
        error_code=error,
    )


def too_many_topics(request: Request, asked: int, most: int) -> Any:
    """Metadata naming more topics than allowed: INVALID_REQUEST, top-level from v13
    (KIP-1102), before that as the one topic listed; no brokers, nothing else."""
    cls: Any = response_class(request.api_key, request.api_version)
    topics: tuple[Any, ...] = ()
    if request.api_version < 13:
        entity = entity_class(cls, "topics")
        topics = (
            topic_without_partitions(entity, ErrorCode.invalid_request, "", uuid.UUID(int=0)),
        )
    return _metadata_refused(cls, topics, ErrorCode.invalid_request)


def metadata_refusal(request: Request, error: ErrorCode) -> Any:
    """Metadata refused as a whole, as Kafka's MetadataRequest.getErrorResponse answers: no
    brokers, no cluster, each topic asked for with ``error`` (a null name as ""), and the
    top-level error from v13."""
    cls: Any = response_class(request.api_key, request.api_version)
    entity = entity_class(cls, "topics")
    topics = tuple(
        topic_without_partitions(entity, error, topic.name or "", getattr(topic, "topic_id", None))
        for topic in request.body.topics or ()
    )
    return _metadata_refused(cls, topics, error)


def response_for(request: Request, **fields: Any) -> Any:
    """The response entity for the request's API version (throttle time filled in)."""
    cls: Any = response_class(request.api_key, request.api_version)
    return cls(throttle_time=NO_THROTTLE, **fields)


def first_listener(listeners: tuple[str, ...]) -> tuple[str, int]:
    """(host, port) of a registration's first ``NAME://host:port`` listener, or ("", -1)."""
    for listener in listeners:
        with contextlib.suppress(ValueError):
            address = parse_listener(listener)[1]
            return address.host, address.port
    return "", -1


def build_entity(cls: Any, **fields: Any) -> Any:
    """Instantiate a kio entity with the given fields that its version has (older versions
    lack e.g. throttle_time, cluster_id or rack)."""
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{name: value for name, value in fields.items() if name in known})
