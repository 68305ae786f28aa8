"""The driver hook: producer ids for a whole Spark job, fetched once, before any task runs.

A job with N partitions needs N producer ids. The driver asks pidctl for ceil(N/1000) blocks
with ``AllocateProducerIds`` as a job (BrokerId -1, BrokerEpoch -1), all pipelined over one
connection, and gets a small picklable :class:`JobAllocation` that maps partition i to the
i-th PID across the blocks, with one fixed epoch. Tasks derive their PID from it and never
contact the controller; a retried task attempt gets the same PID, and (with sequences counted
from the partition's first row) the same (producer id, epoch, sequence) triples.
"""

from __future__ import annotations

import math
import ssl
from dataclasses import dataclass
from typing import Any

from pidctl.client import AuthenticationError, SyncClient
from pidctl.controller.core.kafka import BLOCK_SIZE
from pidctl.protocol import requests

#: The epoch of every job PID: the ids are fresh, never used by anyone before.
JOB_EPOCH = 0


class PreallocationError(RuntimeError):
    """pidctl refused a block (the Kafka error name says why) or could not be reached."""


@dataclass(frozen=True, slots=True)
class JobAllocation:
    """Blocks granted to one job: ``blocks`` are (first producer id, length) in grant order."""

    client_id: str
    blocks: tuple[tuple[int, int], ...]
    epoch: int = JOB_EPOCH

    @property
    def size(self) -> int:
        """How many producer ids (and so partitions) the allocation covers."""
        return sum(length for _, length in self.blocks)

    def producer_id(self, partition: int) -> int:
        """The producer id of partition ``partition`` (0-based): the i-th across the blocks."""
        if partition < 0:
            raise IndexError(f"partition {partition} is negative")
        index = partition
        for first, length in self.blocks:
            if index < length:
                return first + index
            index -= length
        raise IndexError(
            f"partition {partition} is beyond the {self.size} producer ids preallocated for "
            f"{self.client_id}; preallocate at least as many as the job has partitions"
        )

    def producer(self, partition: int) -> tuple[int, int]:
        """(producer id, epoch) of a partition."""
        return self.producer_id(partition), self.epoch


#: Security protocols, as Kafka clients name them (``security.protocol``).
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def client_settings(options: dict[str, str]) -> dict[str, Any]:
    """Connection settings from Kafka-style client properties (``security.protocol``,
    ``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ``ssl.cafile``), as keyword
    arguments of :func:`allocate_job_blocks`. Keys are compared in lower case."""
    lowered = {key.lower(): value for key, value in options.items()}
    protocol = lowered.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise ValueError(f"security.protocol must be one of {', '.join(SECURITY_PROTOCOLS)}")
    settings: dict[str, Any] = {}
    if protocol in ("SSL", "SASL_SSL"):
        settings["ssl_context"] = ssl.create_default_context(cafile=lowered.get("ssl.cafile"))
    if protocol.startswith("SASL_"):
        try:
            settings["sasl"] = (
                lowered.get("sasl.mechanism", "PLAIN").upper(),
                lowered["sasl.username"],
                lowered["sasl.password"],
            )
        except KeyError as e:
            raise ValueError(f"{protocol} needs {e.args[0]}") from None
    return settings


def application_id(spark: Any) -> str:
    """The Spark application id (works for classic sessions and Spark Connect)."""
    return str(spark.conf.get("spark.app.id"))


def allocate_job_blocks(
    bootstrap: str,
    count: int,
    client_id: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    sasl: tuple[str, str, str] | None = None,
    timeout: float = 30.0,
) -> JobAllocation:
    """Fetch ceil(count/1000) blocks over one connection, the requests pipelined."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    wanted = math.ceil(count / BLOCK_SIZE)
    try:
        with SyncClient(
            bootstrap, client_id=client_id, timeout=timeout, ssl_context=ssl_context, sasl=sasl
        ) as client:
            responses = client.pipeline([requests.allocate(-1, -1)] * wanted)
    except (OSError, AuthenticationError) as e:
        raise PreallocationError(f"pidctl at {bootstrap}: {e}") from e
    blocks = []
    for response in responses:
        if response.error_code:
            raise PreallocationError(
                f"pidctl refused a block for {client_id}: {response.error_code.name}"
            )
        blocks.append((int(response.producer_id_start), int(response.producer_id_len)))
    return JobAllocation(client_id, tuple(blocks))


def preallocate_producer_ids(
    spark: Any, *, bootstrap: str, count: int, client_id: str | None = None, **client: Any
) -> JobAllocation:
    """The driver hook: producer ids for ``count`` partitions of a job of ``spark``'s
    application, fetched once from pidctl at ``bootstrap``. The grant records carry the
    application id as client id (``pidctl log dump`` shows which job got which PIDs).
    ``client`` may hold ``ssl_context``, ``sasl`` and ``timeout`` for the connection. In a
    local session the workers run this Python unless told otherwise (``session.py``)."""
    from pidctl.spark.session import use_this_python_locally

    use_this_python_locally(spark)
    return allocate_job_blocks(bootstrap, count, client_id or application_id(spark), **client)
