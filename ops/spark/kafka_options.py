"""``format("pidctl-kafka")``'s options, checked: Spark's Kafka sink's, the Kafka producer
properties it honours or accepts, and pidctl's own (docs/spark-kafka.md has the table).

Light on purpose: Spark unpickles a writer (and so imports this) in a fresh Python process on
the driver for ``writer()`` and again for ``commit()``, where nothing of the rows' path
(numpy, the record builder) is needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pidctl.spark.allocation import client_settings

if TYPE_CHECKING:
    from pidctl.spark.kafka_cluster import KafkaCluster

#: ``compression.type`` as a record batch's attributes say it (Kafka's CompressionType ids).
COMPRESSION = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
DEFAULT_PARTITIONS = 1000
DEFAULT_BATCH_BYTES = 1_000_000
#: Kafka's producer defaults (ProducerConfig), honoured here.
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000
DEFAULT_RETRIES = 2**31 - 1
DEFAULT_RETRY_BACKOFF_MS = 100
DEFAULT_RETRY_BACKOFF_MAX_MS = 1000
#: Default of ``pidHeadroom``: how far above the cluster's own newest producer id the job's
#: must lie. A cluster handing out a thousand ids a second takes 35 years to cross 2^40.
DEFAULT_PID_HEADROOM = 2**40
#: ``delivery``: what a run without a name gets, chosen explicitly.
EXACTLY_ONCE, AT_LEAST_ONCE = "exactly-once", "at-least-once"
#: Kafka producer properties that tune the JVM client's batching and buffers: accepted, so a
#: job switches by changing the format name, and without effect here.
IGNORED_KAFKA_PROPERTIES = frozenset(
    {
        "linger.ms",
        "batch.size",
        "buffer.memory",
        "max.in.flight.requests.per.connection",
        "max.block.ms",
        "send.buffer.bytes",
        "receive.buffer.bytes",
        "max.request.size",
        "client.id",
    }
)
KAFKA_PROPERTIES = frozenset(
    {
        "bootstrap.servers",
        "security.protocol",
        "sasl.mechanism",
        "sasl.jaas.config",
        "ssl.truststore.location",
        "ssl.truststore.type",
        "compression.type",
        "request.timeout.ms",
        "delivery.timeout.ms",
        "retries",
        "retry.backoff.ms",
        "retry.backoff.max.ms",
        "acks",
        "enable.idempotence",
    }
)
#: Spark's own Kafka sink refuses these; so does this one.
SPARK_REFUSED = ("key.serializer", "value.serializer")
_JAAS_FIELD = re.compile(r'(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


class KafkaSinkOptionError(ValueError):
    """A missing or invalid option or column of the sink."""


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    """How a task produces (from the sink's options)."""

    batch_bytes: int = DEFAULT_BATCH_BYTES
    buffer_bytes: int = 32 * 1024 * 1024
    compression: int = COMPRESSION["none"]
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_MS / 1000
    delivery_timeout_s: float = DEFAULT_DELIVERY_TIMEOUT_MS / 1000
    retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_MS / 1000
    retry_backoff_max_s: float = DEFAULT_RETRY_BACKOFF_MAX_MS / 1000
    retries: int = DEFAULT_RETRIES


def _int_option(options: dict[str, str], name: str, default: int, least: int = 1) -> int:
    raw = options.get(name.lower())
    if raw is None:
        return default
    if not raw.strip().lstrip("-").isdigit() or int(raw) < least:
        raise KafkaSinkOptionError(f"option {name} must be an integer >= {least}, got {raw!r}")
    return int(raw)


def kafka_connection(properties: dict[str, str]) -> dict[str, Any]:
    """SyncClient's ``ssl_context``/``sasl`` from Kafka client properties (no prefix)."""
    translated = {"security.protocol": properties.get("security.protocol", "PLAINTEXT")}
    if "sasl.mechanism" in properties:
        translated["sasl.mechanism"] = properties["sasl.mechanism"]
    jaas = properties.get("sasl.jaas.config")
    if jaas is not None:
        for name, value in _JAAS_FIELD.findall(jaas):
            translated[f"sasl.{name}"] = value.replace('\\"', '"')
    store = properties.get("ssl.truststore.location")
    if store is not None:
        if properties.get("ssl.truststore.type", "PEM").upper() != "PEM":
            raise KafkaSinkOptionError(
                "kafka.ssl.truststore.type must be PEM (a JKS or PKCS12 store is Java's)"
            )
        translated["ssl.cafile"] = store
    try:
        return client_settings(translated)
    except ValueError as e:
        raise KafkaSinkOptionError(f"kafka.{e}") from None


@dataclass(frozen=True, slots=True)
class KafkaSinkOptions:
    """The sink's options, checked (Spark hands them over with lower-cased names)."""

    bootstrap_servers: tuple[str, ...]
    topic: str | None
    pidctl_bootstrap: str
    pidctl_connection: dict[str, Any]
    connection: dict[str, Any]
    partitions: int
    app_id: str | None
    app_version: int | None
    delivery: str
    client_id: str
    pid_headroom: int
    expiration_ms: int | None
    producer: ProducerSettings

    def cluster(self) -> KafkaCluster:
        """Connections to the target cluster."""
        from pidctl.spark.kafka_cluster import KafkaCluster

        return KafkaCluster(
            self.bootstrap_servers,
            client_id=self.client_id,
            timeout_s=self.producer.request_timeout_s + 30,
            connection=self.connection,
        )

    @property
    def named(self) -> bool:
        """Whether the run names a job version (exactly once across driver failures)."""
        return self.app_id is not None

    @classmethod
    def parse(
        cls, raw: dict[str, str], default_client_id: str | None, *, stream: bool = False
    ) -> KafkaSinkOptions:
        """Check every option; a missing or invalid one raises KafkaSinkOptionError. A
        ``stream`` is named by its query and batch ids, never by options."""
        options = {name.lower(): value for name, value in raw.items()}
        kafka = {k[len("kafka.") :]: v for k, v in options.items() if k.startswith("kafka.")}
        for name in SPARK_REFUSED:
            if name in kafka:
                raise KafkaSinkOptionError(
                    f"kafka.{name} is not supported: the columns are written as bytes "
                    "(cast them to string or binary), as in Spark's Kafka sink"
                )
        unknown = sorted(set(kafka) - KAFKA_PROPERTIES - IGNORED_KAFKA_PROPERTIES)
        if unknown:
            raise KafkaSinkOptionError(
                f"option kafka.{unknown[0]} is not supported by pidctl-kafka; supported: "
                + ", ".join(f"kafka.{name}" for name in sorted(KAFKA_PROPERTIES))
            )
        servers = tuple(s.strip() for s in kafka.get("bootstrap.servers", "").split(",") if s)
        if not servers:
            raise KafkaSinkOptionError('pidctl-kafka needs .option("kafka.bootstrap.servers", ...)')
        if kafka.get("acks", "all").lower() not in ("all", "-1"):
            raise KafkaSinkOptionError("kafka.acks must be all: exactly once needs acks=all")
        if kafka.get("enable.idempotence", "true").lower() != "true":
            raise KafkaSinkOptionError("kafka.enable.idempotence must be true")
        compression = kafka.get("compression.type", "none").lower()
        if compression not in COMPRESSION:
            raise KafkaSinkOptionError(
                f"kafka.compression.type must be one of {', '.join(COMPRESSION)}, "
                f"got {compression!r}"
            )
        pidctl_bootstrap = options.get("pidctl.bootstrap")
        if not pidctl_bootstrap:
            raise KafkaSinkOptionError('pidctl-kafka needs .option("pidctl.bootstrap", ...)')
        pidctl = {k[len("pidctl.") :]: v for k, v in options.items() if k.startswith("pidctl.")}
        pidctl.pop("bootstrap")
        try:
            pidctl_connection = client_settings(pidctl)
        except ValueError as e:
            raise KafkaSinkOptionError(f"pidctl.{e}") from None
        app_id = options.get("txnappid") or None
        raw_version = options.get("txnversion")
        if (app_id is None) != (raw_version is None):
            raise KafkaSinkOptionError("txnAppId and txnVersion go together: set both or neither")
        version = None if raw_version is None else _int_option(options, "txnVersion", 0, least=0)
        delivery = options.get("delivery", EXACTLY_ONCE).lower()
        if delivery not in (EXACTLY_ONCE, AT_LEAST_ONCE):
            raise KafkaSinkOptionError(
                f"option delivery must be {EXACTLY_ONCE} or {AT_LEAST_ONCE}, got {delivery!r}"
            )
        if stream:
            if app_id is not None:
                raise KafkaSinkOptionError(
                    "a stream's writes are named by its query id and batch id: "
                    "txnAppId/txnVersion apply to batch writes only"
                )
        elif app_id is None and delivery == EXACTLY_ONCE:
            raise KafkaSinkOptionError(
                "pidctl-kafka writes exactly once across driver failures only under a name: "
                'set .option("txnAppId", ...).option("txnVersion", ...) (the same on a re-run, '
                'which then writes only what is missing), or .option("delivery", '
                '"at-least-once") to write without one (a re-run after a driver failure '
                "writes everything again; task retries still write nothing twice)"
            )
        elif app_id is not None and delivery == AT_LEAST_ONCE:
            raise KafkaSinkOptionError(
                'delivery "at-least-once" is for a run without txnAppId/txnVersion'
            )
        request_timeout = _int_option(kafka, "request.timeout.ms", DEFAULT_REQUEST_TIMEOUT_MS)
        delivery_timeout = _int_option(kafka, "delivery.timeout.ms", DEFAULT_DELIVERY_TIMEOUT_MS)
        if delivery_timeout < request_timeout:
            raise KafkaSinkOptionError(
                "kafka.delivery.timeout.ms must be at least kafka.request.timeout.ms "
                f"({delivery_timeout} < {request_timeout}), as Kafka's producer requires"
            )
        producer = ProducerSettings(
            batch_bytes=_int_option(options, "batchBytes", DEFAULT_BATCH_BYTES),
            compression=COMPRESSION[compression],
            request_timeout_s=request_timeout / 1000,
            delivery_timeout_s=delivery_timeout / 1000,
            retries=_int_option(kafka, "retries", DEFAULT_RETRIES, least=0),
            retry_backoff_s=_int_option(
                kafka, "retry.backoff.ms", DEFAULT_RETRY_BACKOFF_MS, least=0
            )
            / 1000,
            retry_backoff_max_s=_int_option(
                kafka, "retry.backoff.max.ms", DEFAULT_RETRY_BACKOFF_MAX_MS, least=0
            )
            / 1000,
        )
        expiration = options.get("produceridexpirationms")
        return cls(
            bootstrap_servers=servers,
            topic=options.get("topic") or None,
            pidctl_bootstrap=pidctl_bootstrap,
            pidctl_connection=pidctl_connection,
            connection=kafka_connection(kafka),
            partitions=_int_option(options, "partitions", DEFAULT_PARTITIONS),
            app_id=app_id,
            app_version=version,
            delivery=delivery,
            client_id=options.get("clientid") or default_client_id or "pidctl-kafka-sink",
            pid_headroom=_int_option(options, "pidHeadroom", DEFAULT_PID_HEADROOM, least=0),
            expiration_ms=(
                None
                if expiration is None
                else _int_option(options, "producerIdExpirationMs", 0, least=1)
            ),
            producer=producer,
        )
