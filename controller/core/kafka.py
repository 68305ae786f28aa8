"""Kafka's numbers, in one place: each is Kafka's own, named after where Kafka defines it."""

from __future__ import annotations

from typing import Final

#: Kafka's ProducerIdsBlock.PRODUCER_ID_BLOCK_SIZE; AllocateProducerIds carries no size.
BLOCK_SIZE: Final = 1000
#: The largest int64 (Long.MAX_VALUE). Kafka never grants it: a block ends strictly below it.
INT64_MAX: Final = 2**63 - 1
#: Kafka's ProducerIdManager asks for the next block once this share of the current is used.
PREFETCH_THRESHOLD: Final = 0.9
#: RecordBatch.NO_PRODUCER_ID and NO_PRODUCER_EPOCH: "none given" in InitProducerId.
NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
#: Kafka's TransactionMetadata.isEpochExhausted: epoch >= Short.MaxValue - 1. The last value
#: (32767) stays free so that the coordinator can always fence.
EPOCH_EXHAUSTED: Final = 32766
#: Short.MaxValue: no epoch reaches it.
MAX_PRODUCER_EPOCH: Final = 32767
#: ``broker.session.timeout.ms`` default.
DEFAULT_SESSION_TIMEOUT_MS: Final = 9000
#: ``transaction.max.timeout.ms`` default.
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS: Final = 900_000
#: ``transactional.id.expiration.ms`` default: 7 days.
DEFAULT_TRANSACTIONAL_ID_EXPIRATION_MS: Final = 7 * 24 * 3600 * 1000
#: The one name of the Cluster resource in ACLs, as in Kafka.
CLUSTER_RESOURCE: Final = "kafka-cluster"
