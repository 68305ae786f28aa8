"""The servers a case is replayed against: Kafka (one node, made ready first) and pidctl (one
server per profile of :data:`~ops.testing.conformance.corpus.PROFILES`)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ops.testing.conformance.corpus import PROFILES, SASL_USER, find, init
from ops.testing.conformance.replay import Target
from ops.testing.coordination import free_port
from ops.testing.kafka import START_TIMEOUT_S, KafkaNode
from ops.testing.serverproc import ServerProcess, add_sasl_user
from pidctl.client import SyncClient

#: The SASL users a Kafka node for conformance has (the ``sasl`` profile logs in as one).
KAFKA_SASL_USERS = {SASL_USER[0]: SASL_USER[1]}
#: Kafka's answers while it loads what a request needs (a coordinator's partitions, a first
#: block of producer ids): retried, bounded, before any case runs.
_LOADING = {14, 15, 16}


def kafka_node() -> KafkaNode:
    """A Kafka node set up as the golden files were recorded: as shipped, plus the SASL
    listeners of the ``sasl`` profile (:attr:`KafkaNode.sasl_users`)."""
    return KafkaNode(sasl_users=KAFKA_SASL_USERS)


def kafka_target(node: KafkaNode, profile: str) -> Target:
    """Where a case of ``profile`` goes on ``node``."""
    if PROFILES[profile].sasl:
        user, password = SASL_USER
        return Target(
            "kafka",
            node.sasl_bootstrap,
            node.controller_sasl_bootstrap,
            node.cluster_id,
            ("PLAIN", user, password),
        )
    return Target("kafka", node.bootstrap, node.controller_bootstrap, node.cluster_id)


def _until_answered(
    client: SyncClient, request: Any, read: Callable[[Any], int], what: str
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while (error := read(client.request(request))) in _LOADING:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Kafka still answers {error} to {what} after {START_TIMEOUT_S} s")
        time.sleep(0.2)
    if error:
        raise RuntimeError(f"Kafka answers {error} to {what}")


def warm_up(node: KafkaNode) -> None:
    """Wait until Kafka answers what the corpus asks without a loading error: its group and
    transaction coordinators loaded (their internal topics created), a block of producer ids
    at its broker. Answers that depend on how long Kafka has been up are not the point."""
    with SyncClient(node.bootstrap, timeout=START_TIMEOUT_S) as client:
        for key_type, what in ((0, "group"), (1, "transaction")):
            _until_answered(
                client,
                find(4, ("pidctl-conformance-warm-up",), key_type),
                lambda answer: int(answer.coordinators[0].error_code),
                f"FindCoordinator for a {what}",
            )
        _until_answered(
            client,
            init(5),
            lambda answer: int(answer.error_code),
            "an idempotent InitProducerId",
        )
        _until_answered(
            client,
            init(5, "pidctl-conformance-warm-up"),
            lambda answer: int(answer.error_code),
            "a transactional InitProducerId",
        )


def _pidctl_arguments(profile: str, directory: Path) -> list[str]:
    settings = list(PROFILES[profile].pidctl_settings)
    if PROFILES[profile].sasl:
        user, password = SASL_USER
        add_sasl_user(directory / "users.json", user, password)
        settings += [
            "--listeners",
            "SASL_PLAINTEXT://127.0.0.1:0",
            "--credentials-file",
            str(directory / "users.json"),
            "--authorizer",
            "acl",
        ]
    if profile == "no-lease":
        # An etcd nobody listens on: the controller starts and answers retriably.
        settings += [
            "--pid-source",
            f"etcd://127.0.0.1:{free_port()}/pidctl-conformance",
            "--etcd-timeout-ms",
            "200",
        ]
    return settings


@contextlib.contextmanager
def pidctl_targets(
    directory: Path, profiles: set[str] | None = None
) -> Iterator[dict[str, Target]]:
    """A pidctl server per profile (each with its data dir below ``directory``), as Targets."""
    with contextlib.ExitStack() as stack:
        targets = {}
        for profile in sorted(profiles or set(PROFILES)):
            home = directory / profile
            home.mkdir(parents=True)
            server = stack.enter_context(
                ServerProcess(home / "data", *_pidctl_arguments(profile, home))
            )
            sasl = None
            if PROFILES[profile].sasl:
                sasl = ("PLAIN", *SASL_USER)
            targets[profile] = Target(
                "pidctl", server.bootstrap, server.bootstrap, server.cluster_id(), sasl
            )
        yield targets
