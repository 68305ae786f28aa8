"""Where a client sends its requests: Metadata (this node is the only broker and the
controller, and hosts no topics) and FindCoordinator (this node coordinates every group and
transactional id), answered as Kafka answers them, authorised per topic or key; nothing is
written."""

from __future__ import annotations

import uuid
from typing import Any, Final

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from pidctl.controller.api.access import Access, ConnectionInfo, RequestLimits
from pidctl.controller.api.quorum import Now
from pidctl.controller.api.responses import (
    KAFKA_MESSAGES,
    NO_THROTTLE,
    Reply,
    build_entity,
    metadata_refusal,
    too_many_keys,
    too_many_topics,
    topic_without_partitions,
)
from pidctl.controller.core.kafka import CLUSTER_RESOURCE
from pidctl.controller.core.state import ControllerState
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
from pidctl.protocol.apis import entity_class, response_class
from pidctl.protocol.codec import Request

#: FindCoordinator key types Kafka defines: group, transaction, share group (KIP-932, from
#: v6 only).
_COORDINATOR_KEY_TYPES: Final = (0, 1, 2)
_TRANSACTION_KEYS: Final = 1
_SHARE_KEYS: Final = 2
_FIRST_SHARE_VERSION: Final = 6


def _topic_id(topic: Any) -> uuid.UUID | None:
    """A Metadata request topic's id, None for none (v0-v9) or the zero id (Kafka's "none")."""
    topic_id = getattr(topic, "topic_id", None)
    return topic_id if topic_id is not None and topic_id.int else None


class MetadataApis:
    """The handlers of Metadata and FindCoordinator: authorise, respond."""

    def __init__(
        self, state: ControllerState, access: Access, node_id: int, limits: RequestLimits
    ) -> None:
        self.state = state
        self.access = access
        self.node_id = node_id
        self.limits = limits

    def metadata(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
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
                    topic_without_partitions(
                        topic_entry, ErrorCode.unknown_topic_id, None, topic_id
                    )
                )
        else:
            topics = self._unknown_topics(request, conn, topic_entry, [t.name for t in asked])
        cluster_operations = AUTHORIZED_OPERATIONS_NOT_REQUESTED
        if 8 <= version <= 10 and request.body.include_cluster_authorized_operations:
            cluster_operations = (
                authorized_operations(
                    self.access.authorizer, conn.principal, conn.host, "Cluster", CLUSTER_RESOURCE
                )
                if self.access.may(conn, "Describe")
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
        may_create_any = not creating or self.access.may(conn, "Create")
        for name in java_hash_set_order(names, java_string_hash):
            if not self.access.may(conn, "Describe", "Topic", name):
                denied.append(
                    topic_without_partitions(
                        entry, ErrorCode.topic_authorization_failed, name, None
                    )
                )
                continue
            if not may_create_any and not self.access.may(conn, "Create", "Topic", name):
                not_creatable.append(
                    topic_without_partitions(
                        entry,
                        ErrorCode.topic_authorization_failed,
                        name,
                        None,
                        is_internal_topic(name),
                    )
                )
                continue
            error = ErrorCode.unknown_topic_or_partition
            if invalid_topic_name(name) is not None:
                error = ErrorCode.invalid_topic_exception
            operations = AUTHORIZED_OPERATIONS_NOT_REQUESTED
            if with_operations:
                operations = authorized_operations(
                    self.access.authorizer, conn.principal, conn.host, "Topic", name
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

    def find_coordinator(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
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
            if not self.access.may(conn, "Describe", resource, key):
                return not_allowed
            return found

        if key_type == _SHARE_KEYS and version >= _FIRST_SHARE_VERSION:
            keys = body.coordinator_keys
            if keys and not self.access.may(conn, "ClusterAction"):
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
