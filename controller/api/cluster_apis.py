"""The brokers' APIs (Kafka's ``ControllerApis`` for a KRaft controller's brokers):
BrokerRegistration, BrokerHeartbeat and UnregisterBroker decided by the cluster manager
(``core/cluster.py``) and applied; DescribeCluster, the brokers registered (or this
controller, KIP-919). Each needs ClusterAction (UnregisterBroker Alter, DescribeCluster
Describe) on the cluster."""

from __future__ import annotations

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from pidctl.controller.api.access import Access, ConnectionInfo, RequestLimits
from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.api.responses import (
    NO_THROTTLE,
    Reply,
    build_entity,
    first_listener,
    response_for,
)
from pidctl.protocol.apis import entity_class, response_class
from pidctl.protocol.codec import Request


class ClusterApis:
    """The handlers of the brokers' APIs: authorise, decide (the cluster manager), apply,
    respond."""

    def __init__(
        self, quorum: QuorumController, access: Access, node_id: int, limits: RequestLimits
    ) -> None:
        self.state = quorum.state
        self.access = access
        self.node_id = node_id
        self.limits = limits
        # Bound once: every request that writes calls it.
        self._apply = quorum.apply

    def broker_registration(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        body = request.body
        if not self.access.may(conn, "ClusterAction"):
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

    def broker_heartbeat(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        body = request.body
        if not self.access.may(conn, "ClusterAction"):
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

    def unregister_broker(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
        if not self.access.may(conn, "Alter"):  # Kafka: Alter on the cluster for this one
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

    def describe_cluster(self, request: Request, now: Now, conn: ConnectionInfo) -> Reply:
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
        if not self.access.may(conn, "Describe"):
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
