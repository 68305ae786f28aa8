"""The servers a case is replayed against: Kafka (one node, made ready first) and pidctl (one
server per profile of :data:`~ops.testing.conformance.corpus.PROFILES`, in any of the
:data:`CONFIGURATIONS` that change the path a request takes through it)."""

from __future__ import annotations

import contextlib
import os
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Configuration:
    """A way of running pidctl that changes the path a request takes through it: settings
    added to every profile's, TLS listeners, a SASL login for the profiles that have none
    (as a super user, so that answers stay those of a server without an authorizer), and
    which build runs (the test process's when None)."""

    about: str
    settings: tuple[str, ...] = ()
    tls: bool = False
    sasl: bool = False
    build: str | None = None


#: Rates no replay reaches: the quotas are on (each request is then read by kio, decided
#: alone and counted), and nothing is throttled.
_UNREACHED_RATE = "1000000"

#: The configurations the whole corpus is replayed in, each compared byte for byte with
#: the first (tests/ops/testing/test_conformance_paths.py).
CONFIGURATIONS: dict[str, Configuration] = {
    "interpreted": Configuration("the interpreted build, as shipped settings", build="interpreted"),
    "compiled": Configuration("the compiled build (mypyc)", build="compiled"),
    "quotas": Configuration(
        "request and producer-id quotas on (no request is read by struct or in a run)",
        (
            "--init-producer-id-quota",
            _UNREACHED_RATE,
            "--allocate-producer-ids-quota",
            _UNREACHED_RATE,
            "--producer-ids-rate",
            _UNREACHED_RATE,
        ),
    ),
    "request-log": Configuration(
        "debug logging: every request logged (each read by kio, decided alone)",
        ("--log-level", "debug"),
    ),
    "sasl": Configuration(
        "SASL_PLAINTEXT listeners, an ACL authorizer, the replay logged in as a super user",
        sasl=True,
    ),
    "tls": Configuration("TLS listeners (SSL; SASL_SSL for the sasl profile)", tls=True),
}
#: The user of the ``sasl`` configuration: a super user.
PATHS_SASL_USER = ("paths", "paths-secret")


@dataclass(frozen=True)
class Identity:
    """What every server of a comparison shares, so that their answers can be equal byte for
    byte: the cluster id and the address advertised to clients."""

    cluster_id: str = "cGlkY3RsLWNvbmZvcm1zAA"
    advertised: str = "127.0.0.1:9092"


def _tls_files(directory: Path) -> tuple[list[str], ssl.SSLContext]:
    """A CA and a server certificate for 127.0.0.1 (trustme), pidctl's settings for them,
    and a client context that trusts the CA."""
    import trustme

    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1")
    issued.private_key_pem.write_to_path(str(directory / "server.key"))
    issued.cert_chain_pems[0].write_to_path(str(directory / "server.pem"))
    for pem in issued.cert_chain_pems[1:]:
        pem.write_to_path(str(directory / "server.pem"), append=True)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    settings = [
        "--ssl-certfile",
        str(directory / "server.pem"),
        "--ssl-keyfile",
        str(directory / "server.key"),
    ]
    return settings, context


def _build_env(build: str | None) -> dict[str, str] | None:
    """The environment that makes a server run ``build``: the compiled tree first on
    PYTHONPATH, or taken off it."""
    if build is None:
        return None
    from ops import compiled

    paths = [
        path
        for path in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if path and "compiled-" not in Path(path).name
    ]
    if build == "compiled":
        paths.insert(0, str(compiled.tree()))
    return {"PYTHONPATH": os.pathsep.join(paths), "TEST_BUILD": build}


def _pidctl_arguments(
    profile: str, directory: Path, configuration: Configuration | None = None
) -> tuple[list[str], tuple[str, str, str] | None]:
    """A profile's server settings (in a configuration), and the SASL login of its clients."""
    settings = list(PROFILES[profile].pidctl_settings)
    login: tuple[str, str, str] | None = None
    sasl = PROFILES[profile].sasl or (configuration is not None and configuration.sasl)
    tls = configuration is not None and configuration.tls
    if sasl:
        user, password = SASL_USER if PROFILES[profile].sasl else PATHS_SASL_USER
        add_sasl_user(directory / "users.json", user, password)
        login = ("PLAIN", user, password)
        settings += [
            "--credentials-file",
            str(directory / "users.json"),
            "--authorizer",
            "acl",
        ]
        if not PROFILES[profile].sasl:
            settings += ["--super-users", f"User:{user}"]
    protocol = ("SASL_SSL" if tls else "SASL_PLAINTEXT") if sasl else ("SSL" if tls else "")
    if protocol:
        settings += ["--listeners", f"{protocol}://127.0.0.1:0"]
    if configuration is not None:
        settings += configuration.settings
    if profile == "no-lease":
        # An etcd nobody listens on: the controller starts and answers retriably.
        settings += [
            "--pid-source",
            f"etcd://127.0.0.1:{free_port()}/pidctl-conformance",
            "--etcd-timeout-ms",
            "200",
        ]
    return settings, login


@contextlib.contextmanager
def pidctl_targets(
    directory: Path,
    profiles: set[str] | None = None,
    configuration: Configuration | None = None,
    identity: Identity | None = None,
) -> Iterator[dict[str, Target]]:
    """A pidctl server per profile (each with its data dir below ``directory``), as
    Targets; in ``configuration`` and with ``identity`` if given."""
    with contextlib.ExitStack() as stack:
        targets = {}
        tls_settings: list[str] = []
        context: ssl.SSLContext | None = None
        if configuration is not None and configuration.tls:
            tls_settings, context = _tls_files(directory)
        for profile in sorted(profiles or set(PROFILES)):
            home = directory / profile
            home.mkdir(parents=True)
            settings, login = _pidctl_arguments(profile, home, configuration)
            if context is not None:
                settings += tls_settings
            if identity is not None:
                settings += [
                    "--cluster-id",
                    identity.cluster_id,
                    "--advertised-listener",
                    identity.advertised,
                ]
            env = _build_env(configuration.build if configuration else None)
            server = stack.enter_context(ServerProcess(home / "data", *settings, env=env))
            targets[profile] = Target(
                "pidctl", server.bootstrap, server.bootstrap, server.cluster_id(), login, context
            )
        yield targets
