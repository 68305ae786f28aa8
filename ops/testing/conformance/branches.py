"""Kafka 4.4's validation and error branches of the APIs pidctl serves, each with the corpus
step that reaches it, or why no step can.

Read from Kafka's own code (the class and method named in each :class:`Branch`): KafkaApis
(handleApiVersionsRequest, handleTopicMetadataRequest, getCoordinator,
handleInitProducerIdRequest), ControllerApis, Topic.validate, SharePartitionKey,
ClusterControlManager.registerBroker, BrokerHeartbeatManager.calculateNextBrokerState,
ReplicationControlManager.processBrokerHeartbeat, TransactionCoordinator.handleInitProducerId
and TransactionMetadata, ProducerIdControlManager, RequestContext.parseRequest and
SaslServerAuthenticator. ``python -m ops.testing.conformance coverage`` prints the report;
tests/ops/testing/test_conformance.py checks that every step named exists and that Kafka's
recorded answer there is the branch's (:attr:`Branch.code`).
"""

from __future__ import annotations

from dataclasses import dataclass

#: A branch's answer when Kafka closes the connection instead.
CLOSED = "closed"
#: A branch's answer that carries no error code (an empty list of coordinators).
ANSWERED = "answered"


@dataclass(frozen=True)
class Branch:
    """One branch: the API, where Kafka decides it, when it is taken, Kafka's answer (an
    error code, or :data:`CLOSED`), and the steps (``case/step``) that reach it, or why none
    can."""

    api: str
    where: str
    when: str
    code: int | str
    steps: tuple[str, ...] = ()
    unreachable: str = ""


_NO_TRANSACTIONS = (
    "pidctl serves no transaction APIs (AddPartitionsToTxn, EndTxn), so a transactional "
    "id is never in a transaction: Empty or Complete*, never Ongoing or Prepare*"
)
_NO_LEADERSHIPS = (
    "a broker of pidctl's leads no partition (pidctl has none), so a shutdown is granted at "
    "once; the corpus's brokers on Kafka lead none either"
)
_NEEDS_ACLS = (
    "needs a principal with some ACLs on both servers (the corpus's SASL user has none); "
    "tests/controller/api/test_handlers.py checks pidctl's side"
)

BRANCHES: tuple[Branch, ...] = (
    # -- request parsing ----------------------------------------------------------------------
    Branch(
        "request",
        "RequestContext.parseRequest",
        "an API key no one knows",
        CLOSED,
        ("request-parsing/unknown-api-key",),
    ),
    Branch(
        "request",
        "RequestContext.parseRequest",
        "an API at a version not served",
        CLOSED,
        ("request-parsing/init-producer-id-v99", "request-parsing/metadata-v-1"),
    ),
    Branch(
        "request",
        "RequestContext.parseRequest",
        "a body that stops short",
        CLOSED,
        (
            "request-parsing/init-v4-cut",
            "request-parsing/metadata-v1-cut",
            "request-parsing/api-versions-v3-cut",
        ),
    ),
    Branch(
        "request",
        "RequestContext.parseRequest",
        "bytes after the body: ignored",
        0,
        (
            "request-trailing-bytes/init-idempotent-v1",
            "request-trailing-bytes/init-idempotent-v4",
            "request-trailing-bytes/api-versions-v3",
            "request-trailing-bytes/find-coordinator-v4",
        ),
    ),
    Branch(
        "request",
        "RequestHeader (KIP-482)",
        "a v2 header's unknown tagged fields: skipped",
        0,
        ("header-tagged-fields/init-idempotent-v4",),
    ),
    Branch(
        "request",
        "RequestHeader",
        "a client id that is not UTF-8: decoded as Java does",
        0,
        ("header-client-id-not-utf8/init-idempotent-v1",),
    ),
    # -- ApiVersions --------------------------------------------------------------------------
    Branch(
        "ApiVersions",
        "SocketServer / ApiVersionsRequest",
        "a version not served: UNSUPPORTED_VERSION in the v0 layout",
        35,
        ("api-versions-broker/v127-unknown",),
    ),
    Branch(
        "ApiVersions",
        "KafkaApis.handleApiVersionsRequest",
        "v3+: client software name or version invalid (KIP-511)",
        42,
        ("api-versions-broker/v3-invalid-software",),
    ),
    Branch(
        "ApiVersions",
        "KafkaApis.handleApiVersionsRequest",
        "the APIs and features",
        0,
        ("api-versions-broker/v4", "api-versions-controller/v4"),
    ),
    Branch(
        "ApiVersions",
        "SaslServerAuthenticator",
        "before SASL authentication: answered",
        0,
        ("sasl-exchange/api-versions-before-authentication",),
    ),
    # -- SaslHandshake / SaslAuthenticate -----------------------------------------------------
    Branch(
        "SaslHandshake",
        "SaslServerAuthenticator",
        "a mechanism not enabled (or in another case): UNSUPPORTED_SASL_MECHANISM, then closed",
        33,
        ("sasl-exchange/unsupported-mechanism", "sasl-exchange/mechanism-in-lower-case"),
    ),
    Branch(
        "SaslHandshake",
        "SaslServerAuthenticator",
        "a second handshake in the exchange",
        34,
        ("sasl-exchange/handshake-again",),
    ),
    Branch(
        "SaslHandshake",
        "KafkaApis.handleSaslHandshakeRequest",
        "once authenticated",
        34,
        ("sasl-exchange/handshake-after-authentication",),
    ),
    Branch(
        "SaslAuthenticate",
        "SaslServerAuthenticator",
        "before a handshake: closed unanswered",
        CLOSED,
        ("sasl-exchange/authenticate-before-handshake",),
    ),
    Branch(
        "SaslAuthenticate",
        "SaslServerAuthenticator",
        "wrong credentials: SASL_AUTHENTICATION_FAILED, then closed",
        58,
        ("sasl-exchange/authenticate-wrong-password",),
    ),
    Branch(
        "SaslAuthenticate",
        "KafkaApis.handleSaslAuthenticateRequest",
        "once authenticated",
        34,
        ("sasl-exchange/authenticate-again",),
    ),
    Branch(
        "request",
        "SaslServerAuthenticator",
        "any other API before authentication: closed",
        CLOSED,
        ("sasl-exchange/after-handshake-again",),
    ),
    # -- Metadata -----------------------------------------------------------------------------
    Branch(
        "Metadata",
        "KafkaApis.handleTopicMetadataRequest",
        "below v12, a null name",
        42,
        ("metadata-topic-names/v10-null-name",),
    ),
    Branch(
        "Metadata",
        "KafkaApis.handleTopicMetadataRequest",
        "below v12, a topic id",
        42,
        ("metadata-topic-names/v11-topic-id",),
    ),
    Branch(
        "Metadata",
        "KafkaApis.handleTopicMetadataRequest",
        "v12+ by id: an unknown id (names then not looked at)",
        100,
        (
            "metadata/v12-unknown-topic-id",
            "metadata-topic-names/v12-name-and-id",
            "metadata-topic-names/v12-id-twice-and-a-name",
        ),
    ),
    Branch(
        "Metadata",
        "KafkaApis.handleTopicMetadataRequest",
        "v12+ neither name nor id "
        "(a null name in Kafka's handler; kept: metadata-neither-name-nor-id)",
        -1,
        ("metadata-topic-names/v12-neither", "metadata-topic-names/v13-neither"),
    ),
    Branch(
        "Metadata",
        "KafkaApis.handleTopicMetadataRequest",
        "no Describe on the topic: TOPIC_AUTHORIZATION_FAILED, not marked internal",
        29,
        ("authorization/metadata-unknown-topic", "authorization/metadata-invalid-name"),
    ),
    Branch(
        "Metadata",
        "KafkaApis.handleTopicMetadataRequest",
        "creation allowed, Describe but no Create: TOPIC_AUTHORIZATION_FAILED",
        29,
        (),
        _NEEDS_ACLS,
    ),
    Branch(
        "Metadata",
        "Topic.validate",
        "a name Kafka refuses (empty, '.', '..', over 249 "
        "characters, other than [a-zA-Z0-9._-]): INVALID_TOPIC_EXCEPTION",
        17,
        (
            "metadata-topic-names/v4-invalid-empty",
            "metadata-topic-names/v12-invalid-dot",
            "metadata-topic-names/v13-invalid-dot-dot",
            "metadata-topic-names/v1-invalid-too-long",
            "metadata-topic-names/v4-invalid-space",
            "metadata-topic-names/v9-operations-invalid",
        ),
    ),
    Branch(
        "Metadata",
        "AutoTopicCreationManager.createTopics",
        "creation allowed, a name Kafka refuses",
        17,
        ("metadata-topic-names/v12-invalid-auto-create", "metadata-topic-names/v1-invalid-space"),
    ),
    Branch(
        "Metadata",
        "KafkaApis.getTopicMetadata",
        "a topic that does not exist",
        3,
        ("metadata/v12-unknown-topic", "metadata-topic-names/v12-valid-dots"),
    ),
    Branch(
        "Metadata",
        "AutoTopicCreationManager.createTopics",
        "creation allowed: created, "
        "UNKNOWN_TOPIC_OR_PARTITION until it exists (pidctl creates nothing)",
        3,
        ("metadata/v0-unknown-topic", "metadata-topic-names/v1-valid-249"),
    ),
    Branch(
        "Metadata",
        "Topic.isInternal",
        "Kafka's own topics: marked internal, existing or not",
        3,
        ("fresh-node/v12-consumer_offsets", "fresh-node/v4-internal-topics"),
    ),
    Branch(
        "Metadata",
        "KafkaApis.handleTopicMetadataRequest",
        "a topic named twice: one entry; several: a set's order",
        3,
        ("metadata-topic-names/v12-named-twice", "metadata-topic-names/v12-set-order"),
    ),
    Branch(
        "Metadata",
        "KafkaApis.handleTopicMetadataRequest",
        "v8+ topic authorized operations asked for",
        3,
        (
            "metadata-topic-names/v8-operations",
            "metadata-topic-names/v12-operations",
        ),
    ),
    Branch(
        "Metadata",
        "KafkaApis.handleTopicMetadataRequest",
        "v8-v10 cluster authorized operations asked for, Describe on the cluster",
        3,
        ("metadata-topic-names/v10-operations", "metadata-topic-names/v8-operations"),
    ),
    Branch(
        "Metadata",
        "KafkaApis.handleTopicMetadataRequest",
        "v8-v10 cluster authorized operations asked for, no Describe on the cluster: 0",
        29,
        ("authorization/metadata-operations-v10",),
    ),
    Branch(
        "Metadata",
        "KafkaApis.handleTopicMetadataRequest",
        "every topic (a null list)",
        0,
        (),
        "Kafka lists its own topics, pidctl hosts none: no answer is comparable",
    ),
    Branch(
        "Metadata",
        "MetadataCache.getTopicMetadata",
        "an existing topic's partitions",
        0,
        (),
        "pidctl hosts no topic",
    ),
    # -- FindCoordinator ----------------------------------------------------------------------
    Branch(
        "FindCoordinator",
        "KafkaApis.getCoordinator",
        "group: no Describe",
        30,
        ("authorization/find-group-v1",),
    ),
    Branch(
        "FindCoordinator",
        "KafkaApis.getCoordinator",
        "transactional id: no Describe",
        53,
        ("authorization/find-txn-v1", "authorization/find-keys-v4"),
    ),
    Branch(
        "FindCoordinator",
        "KafkaApis.getCoordinator",
        "share key below v6",
        42,
        (
            "find-coordinator-share/v1-share",
            "find-coordinator-share/v5-share",
            "authorization/find-share-v5",
        ),
    ),
    Branch(
        "FindCoordinator",
        "AuthHelper.authorizeClusterOperation",
        "share key: no ClusterAction on the cluster fails the whole request",
        31,
        ("authorization/find-share-v6",),
    ),
    Branch(
        "FindCoordinator",
        "SharePartitionKey.getInstance",
        "a share key not group:topicId:partition",
        42,
        (
            "find-coordinator-share/v6-no-partition",
            "find-coordinator-share/v6-bad-topic-id",
            "find-coordinator-share/v6-bad-partition",
            "find-coordinator-share/v6-empty-group",
            "find-coordinator-share/v6-a-part-too-many",
        ),
    ),
    Branch(
        "FindCoordinator",
        "KafkaApis.getCoordinator",
        "a share key, the share-state "
        "topic not there (pidctl: always, it has no share coordinator)",
        15,
        ("fresh-node/v6-share-key", "fresh-node/v6-share-keys"),
    ),
    Branch(
        "FindCoordinator",
        "CoordinatorType.forId",
        "an unknown key type fails the request",
        42,
        ("find-coordinator/v1-unknown-key-type", "find-coordinator/v4-unknown-key-type"),
    ),
    Branch(
        "FindCoordinator",
        "KafkaApis.getCoordinator",
        "found: this node",
        0,
        (
            "find-coordinator/v0-group",
            "find-coordinator/v3-txn",
            "find-coordinator/v6-txn-keys",
            "find-coordinator/v1-empty-txn-key",
        ),
    ),
    Branch(
        "FindCoordinator",
        "KafkaApis.getCoordinator",
        "group or transaction state topic not there yet: created, COORDINATOR_NOT_AVAILABLE",
        15,
        (),
        "a Kafka node's first seconds; pidctl's coordinator (itself) is always there, as "
        "a warmed-up Kafka's is",
    ),
    Branch(
        "FindCoordinator",
        "FindCoordinatorRequest",
        "v4+ no keys",
        ANSWERED,
        ("find-coordinator-share/v6-no-keys", "authorization/find-share-v6-no-keys"),
    ),
    # -- InitProducerId -----------------------------------------------------------------------
    Branch(
        "InitProducerId",
        "KafkaApis.handleInitProducerIdRequest",
        "transactional id: no Write on it",
        53,
        ("authorization/init-transactional",),
    ),
    Branch(
        "InitProducerId",
        "KafkaApis.handleInitProducerIdRequest",
        "idempotent: neither IdempotentWrite on the cluster nor Write on any topic",
        31,
        ("authorization/init-idempotent",),
    ),
    Branch(
        "InitProducerId",
        "KafkaApis.handleInitProducerIdRequest",
        "idempotent with Write on a topic but not IdempotentWrite: allowed by Kafka",
        0,
        (),
        "needs a principal with ACLs on both servers (the corpus's SASL user has none): "
        "tests/e2e/test_idempotent_write_acls.py asks a Kafka node of its own, ACL set by "
        "ACL set, and pidctl answers as it",
    ),
    Branch(
        "InitProducerId",
        "KafkaApis.handleInitProducerIdRequest",
        "v3+: exactly one of producer id and epoch given",
        42,
        ("init-idempotent-v3/pid-only", "init-transactional-v5/epoch-only"),
    ),
    Branch(
        "InitProducerId",
        "KafkaApis.handleInitProducerIdRequest",
        "below v4, PRODUCER_FENCED sent as INVALID_PRODUCER_EPOCH",
        47,
        ("init-transactional-v3/stale-epoch", "init-epoch-exhaustion/v3-stale-old-pid"),
    ),
    Branch(
        "InitProducerId",
        "TransactionCoordinator.handleInitProducerId",
        "no transactional id: a new producer id",
        0,
        ("init-idempotent-v5/first",),
    ),
    Branch(
        "InitProducerId",
        "RPCProducerIdManager.generateProducerId",
        "no block: COORDINATOR_LOAD_IN_PROGRESS",
        14,
        (
            "producer-id-space-exhausted/init-idempotent",
            "producer-id-space-exhausted/init-transactional",
            "producer-ids-unavailable/init-idempotent",
        ),
    ),
    Branch(
        "InitProducerId",
        "TransactionCoordinator.handleInitProducerId",
        "an empty transactional id",
        42,
        ("init-transactional-invalid-v5/empty-id",),
    ),
    Branch(
        "InitProducerId",
        "TransactionStateManager.validateTransactionTimeoutMs",
        "timeout <= 0 or above transaction.max.timeout.ms",
        50,
        (
            "init-transactional-invalid-v5/timeout-0",
            "init-transactional-invalid-v0/timeout-minus-1",
            "init-transactional-invalid-v3/timeout-above-max",
        ),
    ),
    Branch(
        "InitProducerId",
        "TransactionCoordinator.handleInitProducerId",
        "first use: a new producer id at epoch 0",
        0,
        ("init-transactional-v0/first-use", "init-transactional-v5/new-id-with-pair"),
    ),
    Branch(
        "InitProducerId",
        "prepareInitProducerIdTransit",
        "a transition in progress: CONCURRENT_TRANSACTIONS",
        51,
        (),
        _NO_TRANSACTIONS,
    ),
    Branch(
        "InitProducerId",
        "prepareInitProducerIdTransit",
        "the pair's producer id is "
        "neither the current one nor the previous with an exhausted epoch",
        90,
        ("init-transactional-v5/unknown-pid", "init-epoch-exhaustion/stale-old-pid"),
    ),
    Branch(
        "InitProducerId",
        "prepareInitProducerIdTransit",
        "PrepareCommit/PrepareAbort",
        51,
        (),
        _NO_TRANSACTIONS,
    ),
    Branch(
        "InitProducerId",
        "prepareInitProducerIdTransit",
        "Ongoing: fence and abort",
        51,
        (),
        _NO_TRANSACTIONS,
    ),
    Branch(
        "InitProducerId",
        "prepareInitProducerIdTransit",
        "epoch exhausted, the pair's epoch the current (or none): a new producer id",
        0,
        ("init-epoch-exhaustion/rotation", "init-epoch-exhaustion/retry-across-rotation"),
    ),
    Branch(
        "InitProducerId",
        "TransactionMetadata.prepareIncrementProducerEpoch",
        "epoch exhausted, the pair's epoch not the current (kept: epoch-exhausted-stale-pair)",
        -1,
        ("init-epoch-exhaustion/stale-pair-at-32766",),
    ),
    Branch(
        "InitProducerId",
        "TransactionMetadata.prepareIncrementProducerEpoch",
        "no pair, or the current epoch: bumped",
        0,
        (
            "init-transactional-v4/re-init",
            "init-transactional-v5/current-pair",
            "init-epoch-exhaustion/to-32766",
        ),
    ),
    Branch(
        "InitProducerId",
        "TransactionMetadata.prepareIncrementProducerEpoch",
        "the previous epoch: a retry, the same answer",
        0,
        ("init-transactional-v5/retry-previous-pair",),
    ),
    Branch(
        "InitProducerId",
        "TransactionMetadata.prepareIncrementProducerEpoch",
        "any other epoch",
        90,
        ("init-transactional-v5/stale-epoch",),
    ),
    Branch(
        "InitProducerId",
        "TransactionCoordinator",
        "not the coordinator, or loading: NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS",
        16,
        (),
        "pidctl is the one coordinator and always loaded (and never answers 15 or 16: "
        "kafka-python does not recover, DESIGN.md)",
    ),
    # -- AllocateProducerIds ------------------------------------------------------------------
    Branch(
        "AllocateProducerIds",
        "ControllerApis.handleAllocateProducerIdsRequest",
        "no ClusterAction",
        31,
        ("authorization/allocate",),
    ),
    Branch(
        "AllocateProducerIds",
        "ClusterControlManager.checkBrokerEpoch",
        "not registered, or another epoch",
        77,
        (
            "allocate-producer-ids/unregistered",
            "allocate-producer-ids/stale-epoch",
            "allocate-producer-ids/after-unregister",
        ),
    ),
    Branch(
        "AllocateProducerIds",
        "ProducerIdControlManager.generateNextProducerId",
        "a block, fenced or not",
        0,
        ("allocate-producer-ids/fenced", "allocate-producer-ids/unfenced"),
    ),
    Branch(
        "AllocateProducerIds",
        "ProducerIdControlManager.generateNextProducerId",
        "the space used up",
        -1,
        ("producer-id-space-exhausted/exhausted",),
    ),
    Branch(
        "AllocateProducerIds",
        "QuorumController (write deadline)",
        "not committed in time",
        7,
        ("producer-ids-unavailable/allocate",),
    ),
    Branch(
        "AllocateProducerIds",
        "ClusterControlManager.checkBrokerEpoch",
        "broker id -1, epoch -1 (kept: jobs)",
        77,
        ("allocate-for-jobs/unnamed",),
    ),
    # -- BrokerRegistration -------------------------------------------------------------------
    Branch(
        "BrokerRegistration",
        "ControllerApis.handleBrokerRegistration",
        "no ClusterAction",
        31,
        ("authorization/register",),
    ),
    Branch(
        "BrokerRegistration",
        "ClusterControlManager.registerBroker",
        "another cluster id",
        104,
        ("broker-registration/wrong-cluster-id",),
    ),
    Branch(
        "BrokerRegistration",
        "ClusterControlManager.registerBroker",
        "another incarnation while the broker has a valid session",
        101,
        ("broker-registration/other-incarnation-unfenced",),
    ),
    Branch(
        "BrokerRegistration",
        "ClusterControlManager.registerBroker",
        "another incarnation of a fenced broker: a new epoch",
        0,
        ("broker-registration/other-incarnation-fenced",),
    ),
    Branch(
        "BrokerRegistration",
        "ClusterControlManager.registerBroker",
        "the same incarnation: the same epoch",
        0,
        ("broker-registration/same-incarnation",),
    ),
    Branch(
        "BrokerRegistration",
        "ClusterControlManager.registerBroker",
        "migrating from ZooKeeper",
        102,
        ("broker-registration-checks/zk-migrating",),
    ),
    Branch(
        "BrokerRegistration",
        "ClusterControlManager.registerBroker",
        "no log directory, a reserved, a repeated or another broker's (kept: no-log-directories)",
        119,
        (
            "broker-registration/no-log-dir",
            "broker-registration-checks/reserved-directory",
            "broker-registration-checks/directory-twice",
            "broker-registration-checks/directory-of-another",
        ),
    ),
    Branch(
        "BrokerRegistration",
        "ClusterControlManager.registerBroker",
        "no metadata.version (kept: registration-features)",
        119,
        (
            "broker-registration-checks/no-features",
            "broker-registration-checks/no-metadata-version",
        ),
    ),
    Branch(
        "BrokerRegistration",
        "ClusterControlManager.processRegistrationFeature",
        "a "
        "range without the finalized level, a finalized feature missing, an unknown one "
        "without 0 (kept: registration-features)",
        35,
        (
            "broker-registration-checks/metadata-version-not-covered",
            "broker-registration-checks/finalized-feature-missing",
            "broker-registration-checks/unknown-feature-without-0",
        ),
    ),
    Branch(
        "BrokerRegistration",
        "ClusterControlManager.processRegistrationFeature",
        "an unknown feature whose range includes 0",
        0,
        ("broker-registration-checks/unknown-feature-with-0",),
    ),
    Branch(
        "BrokerRegistration",
        "ListenerInfo.fromBrokerRegistrationRequest",
        "no listener",
        0,
        ("broker-registration-checks/no-listener",),
    ),
    Branch(
        "BrokerRegistration",
        "ClusterControlManager.registerBroker",
        "a negative broker id: registered (kept: negative-broker-id)",
        0,
        ("broker-registration-negative-id/register",),
    ),
    # -- BrokerHeartbeat ----------------------------------------------------------------------
    Branch(
        "BrokerHeartbeat",
        "ControllerApis.handleBrokerHeartbeatRequest",
        "no ClusterAction",
        31,
        ("authorization/heartbeat",),
    ),
    Branch(
        "BrokerHeartbeat",
        "ClusterControlManager.checkBrokerEpoch",
        "unknown broker, another epoch, unregistered",
        77,
        (
            "broker-heartbeat/unknown-broker",
            "broker-heartbeat/stale-epoch",
            "broker-heartbeat/after-unregister",
        ),
    ),
    Branch(
        "BrokerHeartbeat",
        "calculateNextBrokerState",
        "FENCED, shut down asked: SHUTDOWN_NOW",
        0,
        ("broker-heartbeat/fenced-shut-down",),
    ),
    Branch(
        "BrokerHeartbeat",
        "calculateNextBrokerState",
        "FENCED, caught up: UNFENCED",
        0,
        (
            "broker-heartbeat/unfence",
            "broker-heartbeat/after-shut-down",
            "broker-heartbeat/after-fenced-shut-down",
        ),
    ),
    Branch(
        "BrokerHeartbeat",
        "calculateNextBrokerState",
        "FENCED, not caught up: FENCED (kept: caught-up-at-once)",
        0,
        ("broker-heartbeat/not-caught-up",),
    ),
    Branch(
        "BrokerHeartbeat",
        "calculateNextBrokerState",
        "FENCED, fencing asked: FENCED",
        0,
        ("broker-heartbeat/fence-again", "broker-heartbeat/want-fence"),
    ),
    Branch(
        "BrokerHeartbeat",
        "calculateNextBrokerState",
        "UNFENCED, fencing and shut down asked: SHUTDOWN_NOW",
        0,
        ("broker-heartbeat/fence-and-shut-down",),
    ),
    Branch(
        "BrokerHeartbeat",
        "calculateNextBrokerState",
        "UNFENCED, fencing asked: FENCED",
        0,
        ("broker-heartbeat/fence",),
    ),
    Branch(
        "BrokerHeartbeat",
        "calculateNextBrokerState",
        "UNFENCED, shut down asked, no leaderships: SHUTDOWN_NOW",
        0,
        ("broker-heartbeat/shut-down",),
    ),
    Branch(
        "BrokerHeartbeat",
        "calculateNextBrokerState",
        "UNFENCED, shut down asked, leaderships: CONTROLLED_SHUTDOWN",
        0,
        (),
        _NO_LEADERSHIPS,
    ),
    Branch(
        "BrokerHeartbeat",
        "calculateNextBrokerState",
        "CONTROLLED_SHUTDOWN (leaders to move, or offsets to pass)",
        0,
        (),
        _NO_LEADERSHIPS,
    ),
    Branch(
        "BrokerHeartbeat",
        "calculateNextBrokerState",
        "UNFENCED: UNFENCED",
        0,
        ("broker-heartbeat/again",),
    ),
    Branch(
        "BrokerHeartbeat",
        "ReplicationControlManager.maybeFenceOneStaleBroker",
        "silent past broker.session.timeout.ms: fenced",
        0,
        (),
        "9 s of silence in a replay; tests/controller/core/test_cluster.py holds pidctl "
        "to the same rule",
    ),
    Branch(
        "BrokerHeartbeat",
        "ReplicationControlManager.processExpiredBrokerHeartbeat",
        "a heartbeat that waited too long in the controller's queue",
        0,
        (),
        "pidctl decides each request when it reads it: it has no queue to wait in",
    ),
    # -- UnregisterBroker ---------------------------------------------------------------------
    Branch(
        "UnregisterBroker",
        "ControllerApis.handleUnregisterBroker",
        "no Alter on the cluster",
        31,
        ("authorization/unregister",),
    ),
    Branch(
        "UnregisterBroker",
        "ReplicationControlManager.unregisterBroker",
        "not registered",
        102,
        ("unregister-broker/unknown", "broker-registration/unregister-again"),
    ),
    Branch(
        "UnregisterBroker",
        "ReplicationControlManager.unregisterBroker",
        "registered",
        0,
        ("broker-registration/unregister",),
    ),
)
