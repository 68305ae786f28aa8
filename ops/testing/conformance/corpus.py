"""The conformance corpus: request sequences replayed against Kafka and against pidctl.

A :class:`Case` is a sequence of :class:`Step` s; each step names the listener it goes to
(Kafka splits its APIs between the broker listener and its KRaft controller's listener; pidctl
answers both on one) and builds its request from a :class:`Context`, which holds the answers
of the steps before it (a KIP-360 retry carries the pair an earlier step got) and makes every
name unique to one replay (the live test shares one Kafka with other tests). A step Kafka
cannot be brought to on one node (the producer-id space used up, a controller that cannot
commit) carries its answer as read in Kafka's source (:class:`KafkaSource`).

The cases cover every error code pidctl can return from InitProducerId, ApiVersions,
FindCoordinator, Metadata and the controller APIs (tests/ops/testing/test_conformance.py
derives that list from pidctl's code and checks it).
"""

from __future__ import annotations

import dataclasses
import secrets
import struct
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kio.schema.broker_registration.v4.request import Feature
from kio.static.primitive import i8, i16, i64

from pidctl.protocol import requests
from pidctl.protocol.apis import ApiKey, request_class
from pidctl.protocol.codec import encode_request
from pidctl.protocol.sasl_client import plain_token

Listener = Literal["broker", "controller"]

#: The features a registering broker must support, each range containing the level Kafka
#: 4.4.0 finalizes (its controller refuses a broker that does not support one with
#: UNSUPPORTED_VERSION). pidctl does not look at them.
KAFKA_FEATURES = (
    ("metadata.version", 7, 33),
    ("kraft.version", 0, 1),
    ("group.version", 0, 1),
    ("share.version", 0, 2),
    ("streams.version", 0, 1),
    ("transaction.version", 0, 2),
    ("eligible.leader.replicas.version", 0, 1),
)
#: A cluster id neither server has.
WRONG_CLUSTER_ID = "AAAAAAAAAAAAAAAAAAAAAA"
#: A producer id no server in a test has handed out.
UNKNOWN_PRODUCER_ID = 2**40
#: ``transaction.max.timeout.ms`` on both (Kafka's default, pidctl's default).
MAX_TRANSACTION_TIMEOUT_MS = 900_000
#: The ``jobs`` profile's job_allocation_reuse_ms.
JOB_REUSE_MS = 1000
#: The SASL user of the ``sasl`` profile: no ACL allows it anything.
SASL_USER = ("alice", "alice-secret")


#: Where a request frame's client id begins: after the length, the API key and version,
#: the correlation id and the client id's length.
CLIENT_ID_AT = 4 + 2 + 2 + 4 + 2


@dataclass(frozen=True)
class Raw:
    """A request kio cannot make, sent on a connection of its own: ApiVersions at a version
    no one knows (the v3 request with the header's version changed; the answer is read as
    ``answer_version``), or ``body`` (by default that ApiVersions v3) with a client id of
    bytes that are not UTF-8 (``client_id``), in a v2 header with tagged fields
    (``header_tags``: their bytes, the count first), with bytes after the body
    (``trailing``) or some cut from its end (``cut``); ``api_key`` and ``version`` are
    written into the frame's header whatever ``body`` is."""

    api_key: int
    version: int
    answer_version: int
    client_id: bytes | None = None
    body: Any = None
    header_tags: bytes | None = None
    #: Bytes sent after the body, inside the frame (Kafka ignores them).
    trailing: bytes = b""
    #: Bytes cut from the end of the frame (a body that stops short).
    cut: int = 0

    def frame(self, correlation_id: int, client_id: str) -> bytes:
        """The whole frame (length prefix included)."""
        body = self.body or request_class(ApiKey.API_VERSIONS, 3)(  # type: ignore[call-arg]
            client_software_name="pidctl-conformance", client_software_version="1"
        )
        raw_id = self.client_id
        if raw_id is not None:
            client_id = "x" * len(raw_id)  # its place in the frame, then its bytes
        frame = bytearray(encode_request(body, correlation_id, client_id))
        struct.pack_into(">hh", frame, 4, self.api_key, self.version)  # after the length
        if raw_id is not None:
            frame[CLIENT_ID_AT : CLIENT_ID_AT + len(raw_id)] = raw_id
        if self.header_tags is not None:
            (length,) = struct.unpack_from(">h", frame, CLIENT_ID_AT - 2)
            tags_at = CLIENT_ID_AT + max(0, length)  # where the header's "no tags" byte is
            frame[tags_at : tags_at + 1] = self.header_tags
        frame += self.trailing
        if self.cut:
            del frame[-self.cut :]
        struct.pack_into(">i", frame, 0, len(frame) - 4)
        return bytes(frame)


@dataclass(frozen=True)
class KafkaSource:
    """A step's answer from Kafka, read in its source because one Kafka node cannot be brought
    to that state: the normalised answer, and where Kafka decides it."""

    answer: Mapping[str, Any]
    source: str


@dataclass(frozen=True)
class Step:
    """One request: its name in the case, its listener, how to build it, how many times to
    send it (pipelined; only the last answer is kept, the others summarised)."""

    name: str
    listener: Listener
    build: Callable[[Context], Any]
    repeat: int = 1
    kafka_source: KafkaSource | None = None
    #: The request header's client id, if not the replay's own (a named job's key).
    client_id: Callable[[Context], str] | None = None
    #: Sent only once the wall clock is this far past the previous step's answer: the
    #: server's clock must pass a limit (a setting of a few milliseconds).
    after_ms: int = 0


@dataclass(frozen=True)
class Case:
    """A sequence of steps, replayed on one connection per listener."""

    name: str
    about: str
    steps: tuple[Step, ...]
    #: Which pidctl server (and which Kafka listeners) it runs against: :data:`PROFILES`.
    profile: str = "plain"
    #: Whether a connection to a SASL profile's listeners logs in first; a case whose steps
    #: are the SASL exchange itself does not.
    login: bool = True
    #: Replayed against a Kafka node of its own that has not been warmed up: what Kafka
    #: answers before its internal topics exist (which a warm-up, or the case itself,
    #: creates).
    fresh_node: bool = False

    @property
    def recordable(self) -> bool:
        """Whether any step is sent to Kafka (the others come from its source)."""
        return any(step.kafka_source is None for step in self.steps)


@dataclass(frozen=True)
class Profile:
    """A server configuration: pidctl's settings, and whether Kafka is reached through its
    SASL listeners (as :data:`SASL_USER`)."""

    about: str
    pidctl_settings: tuple[str, ...] = ()
    sasl: bool = False


PROFILES: dict[str, Profile] = {
    "plain": Profile("as both ship: no authorizer, PLAINTEXT"),
    "sasl": Profile(
        "an ACL authorizer and a SASL_PLAINTEXT listener (PLAIN alone enabled, as on Kafka's "
        "node); the user (PLAIN) has no ACL",
        ("--sasl-enabled-mechanisms", "PLAIN"),
        sasl=True,
    ),
    "exhausted": Profile(
        "pidctl may grant one block of producer ids (first_producer_id 0, last 999)",
        ("--first-producer-id", "0", "--last-producer-id", "999"),
    ),
    "no-lease": Profile(
        "pidctl leases its producer ids from an etcd that does not answer (pid_source)",
    ),
    "jobs": Profile(
        "a named job version gets its blocks back for 1 s (job_allocation_reuse_ms): time "
        "enough for the steps before the last on a slow path, which waits it out; and a "
        "principal may own one app id (max_job_app_ids_per_principal)",
        (
            "--job-allocation-reuse-ms",
            str(JOB_REUSE_MS),
            "--max-job-app-ids-per-principal",
            "1",
        ),
    ),
}


@dataclass
class Context:
    """What a step's request may depend on: the server's cluster id, the answers so far,
    and names unique to this replay (each also kept for normalising answers)."""

    cluster_id: str
    run: str = field(default_factory=lambda: secrets.token_hex(4))
    broker_base: int = field(default_factory=lambda: 1000 + secrets.randbelow(10**6) * 10)
    answers: dict[str, Any] = field(default_factory=dict)
    #: Generated value → its symbol in golden files (``<name:t>``, ``<broker:0>``...).
    symbols: dict[object, str] = field(default_factory=dict)
    _uuids: dict[str, uuid.UUID] = field(default_factory=dict)

    def _named(self, value: object, symbol: str) -> Any:
        self.symbols.setdefault(value, symbol)
        return value

    def txn(self, name: str) -> str:
        """A transactional id (or group, or topic name) unique to this replay."""
        return str(self._named(f"conformance-{self.run}-{name}", f"<name:{name}>"))

    def broker(self, n: int = 0) -> int:
        """Broker id ``n`` of this replay (apart from the node's own and other replays')."""
        return int(self._named(self.broker_base + n, f"<broker:{n}>"))

    def incarnation(self, name: str) -> uuid.UUID:
        """An incarnation (or log directory) id, the same for one name within a replay."""
        if name not in self._uuids:
            self._uuids[name] = self._named(uuid.uuid4(), f"<uuid:{name}>")
        return self._uuids[name]

    def pid(self, step: str) -> int:
        """The producer id an earlier step's answer carries."""
        return int(self.answers[step].producer_id)

    def producer_epoch(self, step: str) -> int:
        """The producer epoch an earlier step's answer carries."""
        return int(self.answers[step].producer_epoch)

    def broker_epoch(self, step: str) -> int:
        """The broker epoch an earlier registration's answer carries."""
        return int(self.answers[step].broker_epoch)


# -- request builders ------------------------------------------------------------------------


def init(
    version: int,
    transactional_id: str | None = None,
    timeout_ms: int = 60_000,
    pair: tuple[int, int] = (-1, -1),
) -> Any:
    """InitProducerId at ``version`` ((pid, epoch) from v3)."""
    return requests.init_producer_id(
        transactional_id,
        timeout_ms,
        producer_id=pair[0],
        producer_epoch=pair[1],
        version=version,
    )


def registration(
    ctx: Context,
    n: int = 0,
    incarnation: str = "a",
    *,
    cluster_id: str | None = None,
    log_dirs: bool = True,
) -> Any:
    """A BrokerRegistration v4 of broker ``n`` as a Kafka 4.4 broker sends it: a listener,
    the features it supports, one log directory."""
    request = requests.registration(
        ctx.broker(n),
        ctx.cluster_id if cluster_id is None else cluster_id,
        ctx.incarnation(incarnation),
        listeners=("PLAINTEXT://127.0.0.1:9",),
    )
    features = tuple(
        Feature(name=name, min_supported_version=i16(low), max_supported_version=i16(high))
        for name, low, high in KAFKA_FEATURES
    )
    directories = (ctx.incarnation(f"log-dir-{n}"),) if log_dirs else ()
    return dataclasses.replace(request, features=features, log_dirs=directories)


def heartbeat(
    ctx: Context,
    step: str,
    n: int = 0,
    *,
    fence: bool = False,
    shut_down: bool = False,
    caught_up: bool = True,
    epoch_offset: int = 0,
) -> Any:
    """A BrokerHeartbeat v2 of broker ``n`` with the epoch registration ``step`` got (plus
    ``epoch_offset``); caught up means it reports the offset of its registration record,
    which is its epoch, as Kafka's brokers do once they have replayed it."""
    epoch = ctx.broker_epoch(step) + epoch_offset
    request = requests.heartbeat(ctx.broker(n), epoch, want_fence=fence, want_shut_down=shut_down)
    offset = epoch if caught_up else 0
    return dataclasses.replace(request, current_metadata_offset=i64(offset))


def allocate(ctx: Context, step: str | None, n: int = 0, epoch_offset: int = 0) -> Any:
    """AllocateProducerIds of broker ``n`` with the epoch registration ``step`` got."""
    epoch = (ctx.broker_epoch(step) if step else 7) + epoch_offset
    return requests.allocate(ctx.broker(n), epoch)


def find(version: int, keys: tuple[str, ...], key_type: int = 1) -> Any:
    """FindCoordinator at ``version``: one key below v4, any number from v4."""
    if version >= 4:
        cls: Any = request_class(ApiKey.FIND_COORDINATOR, version)
        return cls(key_type=i8(key_type), coordinator_keys=keys)
    return requests.find_coordinator(keys[0], key_type, version=version)


def metadata(version: int, topics: list[str] | None, *, by_id: bool = False) -> Any:
    """Metadata at ``version`` naming ``topics`` (by id only, with ``by_id``); no topic is
    created (``allow_auto_topic_creation`` false from v4)."""
    request = requests.metadata(topics, version=version)
    if by_id:
        topic = type(request.topics[0])(name=None, topic_id=uuid.UUID(int=7))
        request = dataclasses.replace(request, topics=(topic,))
    return request


def api_versions(version: int, software: str = "pidctl-conformance") -> Any:
    """ApiVersions at ``version`` (v3+ naming its software, KIP-511)."""
    cls: Any = request_class(ApiKey.API_VERSIONS, version)
    if version >= 3:
        return cls(client_software_name=software, client_software_version="1")
    return cls()


# -- the cases -------------------------------------------------------------------------------


def _steps(*steps: Step) -> tuple[Step, ...]:
    return steps


#: Broker 0 of a replay registers (step "register"), is unfenced, is unregistered.
REGISTER = Step("register", "controller", lambda c: registration(c))
UNFENCE = Step("unfence", "controller", lambda c: heartbeat(c, "register"))
UNREGISTER = Step("unregister", "controller", lambda c: requests.unregister(c.broker(0)))


def _step(name: str, listener: Listener, build: Callable[..., Any], *args: Any) -> Step:
    """A step whose request does not depend on the context: ``build(*args)``."""
    return Step(name, listener, lambda c: build(*args))


def _find(name: str, version: int, keys: tuple[str, ...], key_type: int) -> Step:
    """FindCoordinator for this replay's names ``keys``."""
    return Step(name, "broker", lambda c: find(version, tuple(c.txn(k) for k in keys), key_type))


def _unknown_topic(name: str, version: int) -> Step:
    """Metadata naming a topic that does not exist."""
    return Step(name, "broker", lambda c: metadata(version, [c.txn("topic")]))


def _idempotent(version: int) -> Case:
    steps = [
        Step("first", "broker", lambda c: init(version, timeout_ms=-1)),
        Step("timeout-0", "broker", lambda c: init(version, timeout_ms=0)),
        Step("timeout-max", "broker", lambda c: init(version, timeout_ms=2**31 - 1)),
    ]
    if version >= 3:
        steps += [
            Step("with-pair", "broker", lambda c: init(version, pair=(c.pid("first"), 0))),
            Step("pid-only", "broker", lambda c: init(version, pair=(c.pid("first"), -1))),
            Step("epoch-only", "broker", lambda c: init(version, pair=(-1, 0))),
        ]
    return Case(
        f"init-idempotent-v{version}",
        "idempotent InitProducerId: a fresh producer id at epoch 0 each time, whatever "
        "the timeout; from v3 a given pair is ignored, but exactly one of pid/epoch -1 is not",
        tuple(steps),
    )


def _transactional(version: int) -> Case:
    def tid(c: Context) -> str:
        return c.txn("t")

    steps = [
        Step("first-use", "broker", lambda c: init(version, tid(c))),
        Step("re-init", "broker", lambda c: init(version, tid(c))),
        Step("re-init-again", "broker", lambda c: init(version, tid(c))),
    ]
    if version >= 3:
        current = "re-init-again"
        steps += [
            Step(
                "current-pair",
                "broker",
                lambda c: init(version, tid(c), pair=(c.pid(current), c.producer_epoch(current))),
            ),
            Step(
                "retry-previous-pair",
                "broker",
                lambda c: init(version, tid(c), pair=(c.pid(current), c.producer_epoch(current))),
            ),
            Step(
                "stale-epoch",
                "broker",
                lambda c: init(version, tid(c), pair=(c.pid(current), 0)),
            ),
            Step(
                "unknown-pid",
                "broker",
                lambda c: init(version, tid(c), pair=(UNKNOWN_PRODUCER_ID, 0)),
            ),
            Step(
                "pid-only",
                "broker",
                lambda c: init(version, tid(c), pair=(c.pid(current), -1)),
            ),
            Step("epoch-only", "broker", lambda c: init(version, tid(c), pair=(-1, 3))),
            Step("after-refusals", "broker", lambda c: init(version, tid(c))),
            Step(
                "new-id-with-pair",
                "broker",
                lambda c: init(version, c.txn("new"), pair=(UNKNOWN_PRODUCER_ID, 4)),
            ),
        ]
    return Case(
        f"init-transactional-v{version}",
        "transactional InitProducerId: first use (pid, 0), re-init bumps the epoch; from v3 "
        "(KIP-360) the current pair bumps, a retry of that bump gets the same answer, a stale "
        "pair is fenced (INVALID_PRODUCER_EPOCH below v4, PRODUCER_FENCED from v4), exactly "
        "one of pid/epoch -1 is INVALID_REQUEST",
        tuple(steps),
    )


def _transactional_invalid(version: int) -> Case:
    steps = [
        Step("empty-id", "broker", lambda c: init(version, "")),
        Step("timeout-minus-1", "broker", lambda c: init(version, c.txn("t"), -1)),
        Step("timeout-0", "broker", lambda c: init(version, c.txn("t"), 0)),
        Step(
            "timeout-above-max",
            "broker",
            lambda c: init(version, c.txn("t"), MAX_TRANSACTION_TIMEOUT_MS + 1),
        ),
        Step(
            "timeout-max",
            "broker",
            lambda c: init(version, c.txn("t"), MAX_TRANSACTION_TIMEOUT_MS),
        ),
        Step("timeout-1", "broker", lambda c: init(version, c.txn("t"), 1)),
    ]
    if version == 5:
        steps.append(
            # One byte more than a (non-flexible) Kafka STRING carries.
            Step("id-too-long", "broker", lambda c: init(version, c.txn("x") + "x" * 32767))
        )
    return Case(
        f"init-transactional-invalid-v{version}",
        "transactional InitProducerId refused: an empty id, a timeout <= 0 or above "
        "transaction.max.timeout.ms; the maximum itself and 1 ms are accepted",
        tuple(steps),
    )


#: Re-inits that take a first use's epoch 0 to 32765, one below Kafka's exhaustion mark.
EXHAUSTION_REINITS = 32765


def _epoch_exhaustion() -> Case:
    def tid(c: Context) -> str:
        return c.txn("t")

    return Case(
        "init-epoch-exhaustion",
        "a transactional id re-initialised until its epoch runs out: 32766 is still handed "
        "out, the next re-init rotates to a new producer id at epoch 0 (no client sees "
        "32767); a retry across the rotation gets the same answer",
        _steps(
            Step("first-use", "broker", lambda c: init(5, tid(c))),
            Step("re-inits", "broker", lambda c: init(5, tid(c)), repeat=EXHAUSTION_REINITS),
            Step("to-32766", "broker", lambda c: init(5, tid(c))),
            Step(
                "stale-pair-at-32766",
                "broker",
                lambda c: init(5, tid(c), pair=(c.pid("to-32766"), 32765)),
            ),
            Step(
                "rotation",
                "broker",
                lambda c: init(5, tid(c), pair=(c.pid("to-32766"), c.producer_epoch("to-32766"))),
            ),
            Step(
                "retry-across-rotation",
                "broker",
                lambda c: init(5, tid(c), pair=(c.pid("to-32766"), c.producer_epoch("to-32766"))),
            ),
            Step(
                "stale-old-pid",
                "broker",
                lambda c: init(5, tid(c), pair=(c.pid("to-32766"), 32765)),
            ),
            Step(
                "current-new-pair",
                "broker",
                lambda c: init(5, tid(c), pair=(c.pid("rotation"), 0)),
            ),
            Step("re-init-new-pid", "broker", lambda c: init(5, tid(c))),
            Step(
                "v3-stale-old-pid", "broker", lambda c: init(3, tid(c), pair=(c.pid("to-32766"), 0))
            ),
        ),
    )


def _api_versions(listener: Listener) -> Case:
    steps = [_step(f"v{v}", listener, api_versions, v) for v in range(5)]
    if listener == "broker":
        steps += [
            Step("v3-invalid-software", listener, lambda c: api_versions(3, "-bad name")),
            Step("v127-unknown", listener, lambda c: Raw(ApiKey.API_VERSIONS, 127, 0)),
        ]
    return Case(
        f"api-versions-{listener}",
        f"ApiVersions on Kafka's {listener} listener: the APIs and versions served, the "
        "features finalized; an invalid client software name; a version no one knows (the "
        "answer in the v0 layout)",
        tuple(steps),
    )


#: A client id that is not UTF-8: "café" in Latin-1, then a byte UTF-8 never has.
NOT_UTF8_CLIENT_ID = b"caf\xe9-\xff"


def _raw(name: str, api_key: int, version: int, body: Any, **header: Any) -> Step:
    """A step sending ``body`` as a :class:`Raw` request, its header's ``client_id`` bytes
    or ``header_tags`` as given."""
    request = Raw(api_key, version, version, body=body, **header)
    return Step(f"{name}-v{version}", "broker", lambda c: request)


def _client_id_not_utf8() -> Case:
    def raw(name: str, api_key: int, version: int, body: Any) -> Step:
        return _raw(name, api_key, version, body, client_id=NOT_UTF8_CLIENT_ID)

    return Case(
        "header-client-id-not-utf8",
        "a request header whose client id is not UTF-8, in both header versions: Kafka "
        "decodes it as Java does (what is not UTF-8 replaced) and answers the request",
        _steps(
            raw("api-versions", ApiKey.API_VERSIONS, 0, api_versions(0)),
            raw("api-versions", ApiKey.API_VERSIONS, 3, api_versions(3)),
            raw("init-idempotent", ApiKey.INIT_PRODUCER_ID, 1, init(1)),
            raw("init-idempotent", ApiKey.INIT_PRODUCER_ID, 4, init(4)),
        ),
    )


#: A v2 request header's tagged fields: two, of tags no Kafka knows (7 and 300), then
#: the request's body.
UNKNOWN_HEADER_TAGS = bytes([2, 7, 2]) + b"hi" + bytes([0xAC, 0x02, 0])


def _header_tagged_fields() -> Case:
    tags = UNKNOWN_HEADER_TAGS
    return Case(
        "header-tagged-fields",
        "a v2 request header with tagged fields of tags Kafka does not know: Kafka skips "
        "them and answers the request",
        _steps(
            _raw("api-versions", ApiKey.API_VERSIONS, 3, api_versions(3), header_tags=tags),
            _raw("init-idempotent", ApiKey.INIT_PRODUCER_ID, 4, init(4), header_tags=tags),
        ),
    )


def _find_coordinator() -> Case:
    steps = [Step("v0-group", "broker", lambda c: find(0, (c.txn("g"),), 0))]
    for version in (1, 2, 3):
        steps += [
            _find(f"v{version}-group", version, ("g",), 0),
            _find(f"v{version}-txn", version, ("t",), 1),
        ]
    for version in (4, 5, 6):
        steps += [
            _find(f"v{version}-group", version, ("g",), 0),
            _find(f"v{version}-txn-keys", version, ("t", "u"), 1),
        ]
    steps += [
        Step("v1-unknown-key-type", "broker", lambda c: find(1, (c.txn("t"),), 7)),
        Step("v4-unknown-key-type", "broker", lambda c: find(4, (c.txn("t"),), 7)),
        Step("v1-empty-txn-key", "broker", lambda c: find(1, ("",), 1)),
        Step(
            "v4-too-many-keys",
            "broker",
            lambda c: find(4, tuple(c.txn(f"k{i}") for i in range(1001)), 1),
        ),
    ]
    return Case(
        "find-coordinator",
        "FindCoordinator for groups and transactional ids at every version (a list of keys "
        "from v4); an unknown key type; an empty key; more keys than pidctl's "
        "max_coordinator_keys (1000)",
        tuple(steps),
    )


def _metadata() -> Case:
    steps = []
    for version in (1, 4, 9, 12, 13):
        steps.append(_step(f"v{version}-no-topics", "broker", metadata, version, []))
    for version in (4, 9, 10, 12, 13):
        steps.append(_unknown_topic(f"v{version}-unknown-topic", version))
    steps += [
        Step("v12-unknown-topic-id", "broker", lambda c: metadata(12, [""], by_id=True)),
        Step("v0-unknown-topic", "broker", lambda c: metadata(0, [c.txn("auto")])),
        Step(
            "v12-too-many-topics",
            "broker",
            lambda c: metadata(12, [c.txn(f"t{i}") for i in range(1001)]),
        ),
    ]
    return Case(
        "metadata",
        "Metadata: the brokers and the controller with no topic asked for; a topic that does "
        "not exist (by name, by id; v0-v3 ask for it to be created); more topics than pidctl's "
        "max_metadata_topics (1000)",
        tuple(steps),
    )


def _registration() -> Case:
    return Case(
        "broker-registration",
        "BrokerRegistration: the same incarnation keeps its epoch; another incarnation of a "
        "fenced broker registers with a new epoch, of an unfenced one with a live session is "
        "DUPLICATE_BROKER_REGISTRATION; a wrong cluster id; no log directory",
        _steps(
            REGISTER,
            Step("same-incarnation", "controller", lambda c: registration(c)),
            Step("other-incarnation-fenced", "controller", lambda c: registration(c, 0, "b")),
            Step("unfence", "controller", lambda c: heartbeat(c, "other-incarnation-fenced")),
            Step("other-incarnation-unfenced", "controller", lambda c: registration(c, 0, "c")),
            Step("same-after-unfence", "controller", lambda c: registration(c, 0, "b")),
            Step(
                "wrong-cluster-id",
                "controller",
                lambda c: registration(c, 1, cluster_id=WRONG_CLUSTER_ID),
            ),
            Step("no-log-dir", "controller", lambda c: registration(c, 2, log_dirs=False)),
            UNREGISTER,
            Step("unregister-no-log-dir", "controller", lambda c: requests.unregister(c.broker(2))),
            Step("unregister-again", "controller", lambda c: requests.unregister(c.broker(0))),
        ),
    )


def _negative_broker_id() -> Case:
    def negative(c: Context) -> Any:
        request = registration(c)
        return dataclasses.replace(request, broker_id=-c.broker(0))

    return Case(
        "broker-registration-negative-id",
        "BrokerRegistration with a negative broker id",
        _steps(
            Step("register", "controller", negative),
            Step("unregister", "controller", lambda c: requests.unregister(-c.broker(0))),
        ),
    )


def _heartbeat() -> Case:
    return Case(
        "broker-heartbeat",
        "BrokerHeartbeat: fenced on request, unfenced once caught up with its registration, "
        "not caught up; a controlled shutdown granted (fenced), then unfenced by the next "
        "heartbeat, from an unfenced and a fenced broker; a stale epoch, an unknown broker, "
        "an unregistered one",
        _steps(
            REGISTER,
            Step("want-fence", "controller", lambda c: heartbeat(c, "register", fence=True)),
            Step(
                "not-caught-up",
                "controller",
                lambda c: heartbeat(c, "register", caught_up=False),
            ),
            UNFENCE,
            Step("again", "controller", lambda c: heartbeat(c, "register")),
            Step("stale-epoch", "controller", lambda c: heartbeat(c, "register", epoch_offset=-1)),
            Step("unknown-broker", "controller", lambda c: heartbeat(c, "register", 5)),
            Step("shut-down", "controller", lambda c: heartbeat(c, "register", shut_down=True)),
            Step("after-shut-down", "controller", lambda c: heartbeat(c, "register")),
            Step(
                "fence-and-shut-down",
                "controller",
                lambda c: heartbeat(c, "register", fence=True, shut_down=True),
            ),
            Step("after-fence-and-shut-down", "controller", lambda c: heartbeat(c, "register")),
            Step("fence", "controller", lambda c: heartbeat(c, "register", fence=True)),
            Step("fence-again", "controller", lambda c: heartbeat(c, "register", fence=True)),
            Step(
                "fenced-shut-down",
                "controller",
                lambda c: heartbeat(c, "register", shut_down=True),
            ),
            Step("after-fenced-shut-down", "controller", lambda c: heartbeat(c, "register")),
            UNREGISTER,
            Step("after-unregister", "controller", lambda c: heartbeat(c, "register")),
        ),
    )


def _allocate() -> Case:
    return Case(
        "allocate-producer-ids",
        "AllocateProducerIds: an unregistered broker and a stale epoch get STALE_BROKER_EPOCH; "
        "a registered broker gets consecutive blocks of 1000, fenced or not",
        _steps(
            Step("unregistered", "controller", lambda c: allocate(c, None)),
            REGISTER,
            Step("fenced", "controller", lambda c: allocate(c, "register")),
            Step("fenced-again", "controller", lambda c: allocate(c, "register")),
            Step("stale-epoch", "controller", lambda c: allocate(c, "register", epoch_offset=1)),
            UNFENCE,
            Step("unfenced", "controller", lambda c: allocate(c, "register")),
            UNREGISTER,
            Step("after-unregister", "controller", lambda c: allocate(c, "register")),
        ),
    )


def _unregister() -> Case:
    return Case(
        "unregister-broker",
        "UnregisterBroker of a broker never registered",
        _steps(
            Step("unknown", "controller", lambda c: requests.unregister(c.broker(9))),
        ),
    )


def _authorization() -> Case:
    return Case(
        "authorization",
        "a client with no ACL on an authorizing server: every API that needs one refuses it "
        "(CLUSTER_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "
        "GROUP_AUTHORIZATION_FAILED; pidctl's named job without Write on its AppId "
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED); ApiVersions and Metadata need none",
        _steps(
            Step("api-versions", "broker", lambda c: api_versions(4)),
            Step("init-idempotent", "broker", lambda c: init(5)),
            Step("init-transactional", "broker", lambda c: init(5, c.txn("t"))),
            Step("init-transactional-v3", "broker", lambda c: init(3, c.txn("t"))),
            Step("find-txn-v1", "broker", lambda c: find(1, (c.txn("t"),), 1)),
            Step("find-group-v1", "broker", lambda c: find(1, (c.txn("g"),), 0)),
            Step("find-keys-v4", "broker", lambda c: find(4, (c.txn("t"), c.txn("u")), 1)),
            Step("metadata-no-topics", "broker", lambda c: metadata(12, [])),
            Step("metadata-unknown-topic", "broker", lambda c: metadata(12, [c.txn("topic")])),
            Step(
                "metadata-operations-v10",
                "broker",
                lambda c: metadata_topics(10, [(c.txn("topic"), None)], operations=True),
            ),
            Step(
                "metadata-invalid-name",
                "broker",
                lambda c: metadata_topics(12, [("bad name!", None), ("__consumer_offsets", None)]),
            ),
            _step("find-share-v6", "broker", find, 6, (SHARE_KEY, "g"), 2),
            _step("find-share-v6-no-keys", "broker", find, 6, (), 2),
            _step("find-share-v5", "broker", find, 5, (SHARE_KEY,), 2),
            REGISTER,
            Step(
                "heartbeat",
                "controller",
                lambda c: requests.heartbeat(c.broker(0), 7, want_fence=False),
            ),
            Step("allocate", "controller", lambda c: allocate(c, None)),
            Step("allocate-for-a-job", "controller", lambda c: requests.allocate(-1, -1)),
            Step(
                "allocate-for-a-named-job",
                "controller",
                lambda c: requests.allocate(-1, -1),
                client_id=_job(1, 0),
            ),
            UNREGISTER,
        ),
        profile="sasl",
    )


def _sasl_exchange() -> Case:
    def after(name: str) -> Step:
        """A request that shows whether the connection is still open (and authenticated:
        before authentication it closes one)."""
        return Step(name, "broker", lambda c: metadata(12, []))

    def handshake(name: str, mechanism: str) -> Step:
        return _step(name, "broker", requests.sasl_handshake, mechanism)

    def authenticate(name: str) -> Step:
        return _step(name, "broker", requests.sasl_authenticate, plain_token(*SASL_USER))

    return Case(
        "sasl-exchange",
        "the SASL exchange itself on the SASL listener: a SaslAuthenticate before the "
        "handshake closes the connection unanswered; a mechanism not enabled, or enabled but "
        "in other case, is UNSUPPORTED_SASL_MECHANISM naming those enabled, and closes; a "
        "second handshake during the exchange is ILLEGAL_SASL_STATE and closes; ApiVersions "
        "is answered before authentication; a wrong password is SASL_AUTHENTICATION_FAILED "
        "and closes; once "
        "authenticated, SaslAuthenticate and SaslHandshake are ILLEGAL_SASL_STATE and the "
        "connection stays",
        _steps(
            authenticate("authenticate-before-handshake"),
            handshake("unsupported-mechanism", "SCRAM-SHA-256"),
            after("after-unsupported-mechanism"),
            handshake("mechanism-in-lower-case", "plain"),
            after("after-mechanism-in-lower-case"),
            handshake("handshake", "PLAIN"),
            handshake("handshake-again", "PLAIN"),
            after("after-handshake-again"),
            _step("api-versions-before-authentication", "broker", api_versions, 3),
            handshake("handshake-for-wrong-password", "PLAIN"),
            _step(
                "authenticate-wrong-password",
                "broker",
                requests.sasl_authenticate,
                plain_token(SASL_USER[0], "not-the-password"),
            ),
            after("after-wrong-password"),
            handshake("handshake-to-authenticate", "PLAIN"),
            authenticate("authenticate"),
            authenticate("authenticate-again"),
            handshake("handshake-after-authentication", "PLAIN"),
            after("after-authentication"),
        ),
        profile="sasl",
        login=False,
    )


_NO_BLOCK_FOR_INIT = KafkaSource(
    {"error_code": 14, "producer_id": -1, "producer_epoch": -1},
    "core/src/main/scala/kafka/coordinator/transaction/ProducerIdManager.scala "
    "(RPCProducerIdManager.generateProducerId): with no block, "
    'Errors.COORDINATOR_LOAD_IN_PROGRESS.exception("Producer ID block is full. Waiting '
    "for next block\"); KafkaApis answers InitProducerId with it (the broker's ask for a "
    "block failed, so none comes)",
)


def _space_exhausted() -> Case:
    return Case(
        "producer-id-space-exhausted",
        "the producer-id space used up: AllocateProducerIds gets UNKNOWN_SERVER_ERROR and "
        "InitProducerId COORDINATOR_LOAD_IN_PROGRESS (Kafka's answers from its source: its "
        "space is 2^63 ids, beyond reach)",
        _steps(
            REGISTER,
            UNFENCE,
            Step("last-block", "controller", lambda c: allocate(c, "register")),
            Step(
                "exhausted",
                "controller",
                lambda c: allocate(c, "register"),
                kafka_source=KafkaSource(
                    {"error_code": -1, "producer_id_start": 0, "producer_id_len": 0},
                    "metadata/src/main/java/org/apache/kafka/controller/"
                    "ProducerIdControlManager.java (generateNextProducerId): "
                    "UnknownServerException(\"Exhausted all producerIds as the next block's "
                    'end producerId has exceeded the int64 type limit"); ControllerApis '
                    "answers with Errors.forException: UNKNOWN_SERVER_ERROR, start 0, length 0",
                ),
            ),
            Step("init-idempotent", "broker", lambda c: init(5), kafka_source=_NO_BLOCK_FOR_INIT),
            Step(
                "init-transactional",
                "broker",
                lambda c: init(5, c.txn("t")),
                kafka_source=_NO_BLOCK_FOR_INIT,
            ),
            UNREGISTER,
        ),
        profile="exhausted",
    )


def _no_lease() -> Case:
    return Case(
        "producer-ids-unavailable",
        "no producer ids to grant for now (pidctl: no lease from etcd; Kafka: a controller "
        "that cannot commit): AllocateProducerIds REQUEST_TIMED_OUT, InitProducerId "
        "COORDINATOR_LOAD_IN_PROGRESS, both retriable (Kafka's answers from its source)",
        _steps(
            REGISTER,
            UNFENCE,
            Step(
                "allocate",
                "controller",
                lambda c: allocate(c, "register"),
                kafka_source=KafkaSource(
                    {"error_code": 7, "producer_id_start": 0, "producer_id_len": 0},
                    "metadata/src/main/java/org/apache/kafka/controller/QuorumController.java: "
                    "a write event not committed within the request's deadline fails with "
                    "TimeoutException; ControllerApis answers AllocateProducerIds with "
                    "Errors.forException: REQUEST_TIMED_OUT, start 0, length 0",
                ),
            ),
            Step("init-idempotent", "broker", lambda c: init(5), kafka_source=_NO_BLOCK_FOR_INIT),
            UNREGISTER,
        ),
        profile="no-lease",
    )


def _job(version: int, block: int) -> Callable[[Context], str]:
    """The client id naming block ``block`` of ``version`` of this replay's app."""
    return lambda c: f"pidctl-job/{version}/{block}/{c.txn('app')}"


def _jobs() -> Case:
    def job(c: Context) -> Any:
        return requests.allocate(-1, -1)

    return Case(
        "allocate-for-jobs",
        "AllocateProducerIds from a job (BrokerId -1, BrokerEpoch -1; pidctl's extension for "
        "Spark drivers), unnamed and named in the client id (pidctl-job/VERSION/BLOCK/APP): "
        "a block recorded under the name comes back, an older version is PRODUCER_FENCED, a "
        "block out of order or a malformed name INVALID_REQUEST, a re-run past "
        "job_allocation_reuse_ms UNKNOWN_PRODUCER_ID, an app id past the principal's "
        "max_job_app_ids_per_principal POLICY_VIOLATION. Kafka has no jobs",
        _steps(
            Step("unnamed", "controller", job),
            Step("named", "controller", job, client_id=_job(2, 0)),
            Step("named-again", "controller", job, client_id=_job(2, 0)),
            Step("block-out-of-order", "controller", job, client_id=_job(2, 2)),
            Step("older-version", "controller", job, client_id=_job(1, 0)),
            Step(
                "malformed-name",
                "controller",
                job,
                client_id=lambda c: f"pidctl-job/x/0/{c.txn('app')}",
            ),
            Step(
                "named-past-reuse",
                "controller",
                job,
                client_id=_job(2, 0),
                after_ms=JOB_REUSE_MS + 2,
            ),
            Step(
                "another-app-id-past-the-limit",
                "controller",
                job,
                client_id=lambda c: f"pidctl-job/1/0/{c.txn('other-app')}",
            ),
        ),
        profile="jobs",
    )


# -- cases derived from Kafka's validation branches (coverage.py maps each branch) ----------

#: Topic names Kafka's Topic.validate refuses (INVALID_TOPIC_EXCEPTION): never created, so
#: the same in every replay.
INVALID_TOPIC_NAMES = {
    "space": "bad name!",
    "dot": ".",
    "dot-dot": "..",
    "too-long": "x" * 250,
}
#: Names that do not exist, asked for without creation: their order in Kafka's answer is
#: its set's (a java.util.HashSet's), compared as it is.
UNORDERED_NAMES = ("pidctl-conformance-b", "pidctl-conformance-a", "pidctl-conformance-c")
#: Kafka's own topics, which a Metadata answer marks internal whether they exist or not.
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state", "__share_group_state")
#: A topic id no server has (Metadata v12+ by id).
UNKNOWN_TOPIC_ID = uuid.UUID(int=7)


def metadata_topics(
    version: int,
    topics: list[tuple[str | None, uuid.UUID | None]],
    *,
    auto_create: bool = False,
    operations: bool = False,
) -> Any:
    """Metadata at ``version`` naming ``topics`` as (name, topic id) pairs (ids from v10),
    allowing creation (v4+: ``auto_create``; below v4 always) and asking for the authorized
    operations (v8+: ``operations``)."""
    request = requests.metadata(["x"], version=version)
    entry = type(request.topics[0])
    if version >= 10:
        listed = tuple(entry(name=name, topic_id=topic_id) for name, topic_id in topics)
    else:
        listed = tuple(entry(name=name) for name, _ in topics)
    fields: dict[str, Any] = {"topics": listed}
    if version >= 4:
        fields["allow_auto_topic_creation"] = auto_create
    if version >= 8:
        fields["include_topic_authorized_operations"] = operations
    if 8 <= version <= 10:
        fields["include_cluster_authorized_operations"] = operations
    return dataclasses.replace(request, **fields)


def _named(step: str, version: int, *names: str, **options: Any) -> Step:
    """Metadata naming ``names`` (constants: names nobody creates)."""
    return Step(
        step, "broker", lambda c: metadata_topics(version, [(n, None) for n in names], **options)
    )


def _metadata_topic_names() -> Case:
    steps: list[Step] = []
    for version in (1, 4, 12, 13):
        for label, name in INVALID_TOPIC_NAMES.items():
            steps.append(_named(f"v{version}-invalid-{label}", version, name))
    steps += [
        _named("v4-invalid-empty", 4, ""),
        _named("v12-invalid-empty", 12, ""),
        _named("v4-invalid-auto-create", 4, "bad name!", auto_create=True),
        _named("v12-invalid-auto-create", 12, "bad name!", auto_create=True),
        Step(
            "v1-valid-249",
            "broker",
            lambda c: metadata_topics(1, [(c.txn("m").ljust(249, "x"), None)], auto_create=True),
        ),
        Step(
            "v12-valid-dots",
            "broker",
            lambda c: metadata_topics(12, [(c.txn("a..b"), None)]),
        ),
        Step(
            "v1-named-twice",
            "broker",
            lambda c: metadata_topics(1, [(c.txn("twice"), None), (c.txn("twice"), None)]),
        ),
        Step(
            "v12-named-twice",
            "broker",
            lambda c: metadata_topics(12, [(c.txn("twice-12"), None)] * 2),
        ),
        _named("v12-set-order", 12, *UNORDERED_NAMES, UNORDERED_NAMES[1]),
        _named("v12-invalid-and-unknown", 12, "bad name!", UNORDERED_NAMES[0]),
    ]
    for version in (8, 10, 11, 12):
        steps.append(_named(f"v{version}-operations", version, UNORDERED_NAMES[0], operations=True))
    steps += [
        _named("v9-operations-invalid", 9, "bad name!", operations=True),
        Step(
            "v10-null-name",
            "broker",
            lambda c: metadata_topics(10, [(None, None)]),
        ),
        Step(
            "v11-topic-id",
            "broker",
            lambda c: metadata_topics(11, [(UNORDERED_NAMES[0], UNKNOWN_TOPIC_ID)]),
        ),
        Step(
            "v12-name-and-id",
            "broker",
            lambda c: metadata_topics(12, [(UNORDERED_NAMES[0], UNKNOWN_TOPIC_ID)]),
        ),
        Step(
            "v12-id-twice-and-a-name",
            "broker",
            lambda c: metadata_topics(
                12, [(None, UNKNOWN_TOPIC_ID), (None, UNKNOWN_TOPIC_ID), (UNORDERED_NAMES[0], None)]
            ),
        ),
        Step("v12-neither", "broker", lambda c: metadata_topics(12, [(None, None)])),
        Step("v13-neither", "broker", lambda c: metadata_topics(13, [(None, None)])),
    ]
    return Case(
        "metadata-topic-names",
        "Metadata's checks of the topics named (KafkaApis.handleTopicMetadataRequest, "
        "Topic.validate): names Kafka refuses (INVALID_TOPIC_EXCEPTION, with and without "
        "creation allowed), the longest name taken, a name named twice (one entry), several "
        "names (Kafka's set order), the authorized operations asked for, a null name or a "
        "topic id below v12 (INVALID_REQUEST), names with ids (ids win), neither",
        tuple(steps),
    )


#: A share-partition key Kafka reads (group:topicId:partition), and keys it refuses.
SHARE_KEY = "g:AAAAAAAAAAAAAAAAAAAAAA:0"
BAD_SHARE_KEYS = {
    "no-partition": "g:AAAAAAAAAAAAAAAAAAAAAA",
    "bad-topic-id": "g:not-a-topic-id:0",
    "bad-partition": "g:AAAAAAAAAAAAAAAAAAAAAA:x",
    "empty-group": ":AAAAAAAAAAAAAAAAAAAAAA:0",
    "a-part-too-many": "g:AAAAAAAAAAAAAAAAAAAAAA:0:1",
}


def _find_coordinator_share() -> Case:
    steps = [
        _step(f"v{version}-share", "broker", find, version, (SHARE_KEY,), 2)
        for version in (1, 3, 4, 5)
    ]
    steps += [
        _step(f"v6-{label}", "broker", find, 6, (key,), 2) for label, key in BAD_SHARE_KEYS.items()
    ]
    steps.append(_step("v6-no-keys", "broker", find, 6, (), 2))
    return Case(
        "find-coordinator-share",
        "FindCoordinator for share groups (key type 2, KIP-932): INVALID_REQUEST below v6 "
        "and for a key that is not group:topicId:partition (SharePartitionKey)",
        tuple(steps),
    )


def _fresh_node() -> Case:
    steps = [
        _named(f"v12-{name.strip('_')}", 12, name, operations=True) for name in INTERNAL_TOPICS
    ]
    steps += [
        _named("v4-internal-topics", 4, *INTERNAL_TOPICS),
        _step("v6-share-key", "broker", find, 6, (SHARE_KEY,), 2),
        _step("v6-share-keys", "broker", find, 6, (SHARE_KEY, "h:AAAAAAAAAAAAAAAAAAAAAA:-1"), 2),
    ]
    return Case(
        "fresh-node",
        "before Kafka's internal topics exist (a node of its own, not warmed up): Metadata "
        "marks them internal and unknown; FindCoordinator for a well-formed share-partition "
        "key is COORDINATOR_NOT_AVAILABLE, which pidctl, with no share coordinator, always "
        "answers",
        tuple(steps),
        fresh_node=True,
    )


def _features(*drop: str, add: tuple[tuple[str, int, int], ...] = ()) -> tuple[Any, ...]:
    kept = [f for f in KAFKA_FEATURES if f[0] not in drop]
    return tuple(
        Feature(name=name, min_supported_version=i16(low), max_supported_version=i16(high))
        for name, low, high in (*kept, *add)
    )


def _registering(name: str, n: int, **fields: Any) -> Step:
    """BrokerRegistration of broker ``n`` with ``fields`` replaced (callables get the
    context)."""

    def build(c: Context) -> Any:
        values = {k: v(c) if callable(v) else v for k, v in fields.items()}
        return dataclasses.replace(registration(c, n), **values)

    return Step(name, "controller", build)


def _registration_checks() -> Case:
    reserved = uuid.UUID(int=1)  # DirectoryId.LOST: reserved

    def directory(c: Context) -> tuple[uuid.UUID, ...]:
        return (c.incarnation("shared-dir"),)

    return Case(
        "broker-registration-checks",
        "BrokerRegistration's checks in ClusterControlManager.registerBroker: a broker "
        "migrating from ZooKeeper; features without metadata.version, not covering what "
        "Kafka finalized, lacking a finalized one, an unknown one (taken if it includes "
        "0); log directories reserved, repeated, or another broker's; no listener",
        _steps(
            _registering("zk-migrating", 0, is_migrating_zk_broker=True),
            _registering("no-features", 1, features=()),
            _registering("no-metadata-version", 2, features=_features("metadata.version")),
            _registering(
                "metadata-version-not-covered",
                3,
                features=_features("metadata.version", add=(("metadata.version", 7, 8),)),
            ),
            _registering("finalized-feature-missing", 4, features=_features("group.version")),
            _registering(
                "unknown-feature-without-0",
                5,
                features=_features(add=(("pidctl.unknown.version", 1, 5),)),
            ),
            _registering(
                "unknown-feature-with-0",
                6,
                features=_features(add=(("pidctl.unknown.version", 0, 5),)),
            ),
            _registering("reserved-directory", 7, log_dirs=(reserved,)),
            _registering(
                "directory-twice",
                8,
                log_dirs=lambda c: (c.incarnation("twice-dir"), c.incarnation("twice-dir")),
            ),
            _registering("directory", 9, log_dirs=directory),
            _registering("directory-of-another", 10, log_dirs=directory),
            _registering("no-listener", 11, listeners=()),
            Step("unregister-6", "controller", lambda c: requests.unregister(c.broker(6))),
            Step("unregister-9", "controller", lambda c: requests.unregister(c.broker(9))),
            Step("unregister-11", "controller", lambda c: requests.unregister(c.broker(11))),
        ),
    )


#: What a request frame carries after its body in request-trailing-bytes.
TRAILING = b"\0\0\0\0junk"


def _trailing(name: str, listener: Listener, body: Callable[[Context], Any]) -> Step:
    def build(c: Context) -> Raw:
        request = body(c)
        version = int(request.__version__)
        return Raw(int(request.__api_key__), version, version, body=request, trailing=TRAILING)

    return Step(name, listener, build)


def _trailing_bytes() -> Case:
    return Case(
        "request-trailing-bytes",
        "a request frame with bytes after its body: Kafka reads the body and ignores the "
        "rest, on every API (the hot requests pidctl reads by struct included)",
        _steps(
            _trailing("api-versions-v3", "broker", lambda c: api_versions(3)),
            _trailing("init-idempotent-v1", "broker", lambda c: init(1)),
            _trailing("init-idempotent-v4", "broker", lambda c: init(4)),
            _trailing("init-transactional-v5", "broker", lambda c: init(5, c.txn("t"))),
            _trailing("metadata-v1", "broker", lambda c: metadata(1, [])),
            _trailing("metadata-v12", "broker", lambda c: metadata(12, [c.txn("topic")])),
            _trailing("find-coordinator-v4", "broker", lambda c: find(4, (c.txn("g"),), 0)),
            _trailing("allocate", "controller", lambda c: allocate(c, None)),
            _trailing("unregister", "controller", lambda c: requests.unregister(c.broker(9))),
        ),
    )


def _request_parsing() -> Case:
    def raw(name: str, request: Raw) -> Step:
        return Step(name, "broker", lambda c: request)

    return Case(
        "request-parsing",
        "requests Kafka cannot parse (RequestContext.parseRequest, SocketServer): an API key "
        "no one knows, an API at a version not served, a body that stops short; Kafka "
        "closes the connection without an answer",
        _steps(
            raw("unknown-api-key", Raw(9999, 0, 0)),
            raw("init-producer-id-v99", Raw(ApiKey.INIT_PRODUCER_ID, 99, 0)),
            raw("metadata-v-1", Raw(ApiKey.METADATA, -1, 0)),
            raw("init-v4-cut", Raw(ApiKey.INIT_PRODUCER_ID, 4, 4, body=init(4), cut=3)),
            raw("metadata-v1-cut", Raw(ApiKey.METADATA, 1, 1, body=metadata(1, []), cut=2)),
            raw("api-versions-v3-cut", Raw(ApiKey.API_VERSIONS, 3, 3, cut=2)),
        ),
    )


def _cases() -> Iterator[Case]:
    for version in range(6):
        yield _idempotent(version)
    for version in range(6):
        yield _transactional(version)
    for version in (0, 3, 5):
        yield _transactional_invalid(version)
    yield _epoch_exhaustion()
    yield _api_versions("broker")
    yield _api_versions("controller")
    yield _client_id_not_utf8()
    yield _header_tagged_fields()
    yield _find_coordinator()
    yield _metadata()
    yield _registration()
    yield _negative_broker_id()
    yield _heartbeat()
    yield _allocate()
    yield _unregister()
    yield _authorization()
    yield _sasl_exchange()
    yield _space_exhausted()
    yield _no_lease()
    yield _jobs()
    yield _metadata_topic_names()
    yield _find_coordinator_share()
    yield _fresh_node()
    yield _registration_checks()
    yield _trailing_bytes()
    yield _request_parsing()


CASES: tuple[Case, ...] = tuple(_cases())
CASES_BY_NAME: dict[str, Case] = {case.name: case for case in CASES}
assert len(CASES_BY_NAME) == len(CASES), "case names must be unique"
assert all(case.profile in PROFILES for case in CASES)
