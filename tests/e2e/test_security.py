"""TLS, SASL and ACLs against the real server, with certificates made here (trustme) and real
Kafka clients (confluent-kafka, kafka-python)."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kafka
import pytest
import trustme
from kio.schema.errors import ErrorCode

from ops.testing.serverproc import ServerProcess, add_sasl_user, wait_until
from pidctl.client import AuthenticationError, SyncClient
from pidctl.controller.core.records import ProducerIdsGranted
from pidctl.protocol import requests
from pidctl.protocol.codec import encode_request
from tests import wire
from tests.e2e.test_clients import kafka_python_pid, librdkafka_pid
from tests.e2e.test_operations import scrape

PASSWORDS = {
    "admin": "admin-pw",
    "broker": "broker-pw",
    "producer": "producer-pw",
    "nobody": "nobody-pw",
}

ACLS = [
    {"principal": "User:broker", "operation": "ClusterAction", "resource_type": "Cluster"},
    {"principal": "User:broker", "operation": "Alter", "resource_type": "Cluster"},
    {
        "principal": "User:CN=broker-tls,OU=brokers,O=acme",
        "operation": "ClusterAction",
        "resource_type": "Cluster",
    },
    {"principal": "User:producer", "operation": "IdempotentWrite", "resource_type": "Cluster"},
    {
        "principal": "User:CN=producer-tls,OU=apps,O=acme",
        "operation": "IdempotentWrite",
        "resource_type": "Cluster",
    },
    {
        "principal": "User:producer",
        "operation": "Write",
        "resource_type": "TransactionalId",
        "resource_name": "app-",
        "pattern_type": "prefixed",
    },
    {
        "principal": "User:producer",
        "operation": "Write",
        "resource_type": "TransactionalId",
        "resource_name": "app-secret",
        "permission": "deny",
    },
]


@dataclass
class Secured:
    server: ServerProcess
    ca: trustme.CA
    tmp: Path
    config: Path
    sasl_plaintext: str
    tls: str
    sasl_ssl: str

    def client_context(self, client_cert: str | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if client_cert:
            self.ca.issue_cert(
                client_cert,
                common_name=client_cert,
                organization_name="acme",
                organization_unit_name="brokers",
            ).configure_cert(context)
        return context


def _write_config(path: Path, tmp: Path, acls: list[dict[str, str]]) -> None:
    def toml(value: object) -> str:
        return json.dumps(value)

    lines = [
        'listeners = "SASL_PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0"',
        f"ssl_certfile = {toml(str(tmp / 'server.pem'))}",
        f"ssl_keyfile = {toml(str(tmp / 'server.key'))}",
        f"ssl_cafile = {toml(str(tmp / 'ca.pem'))}",
        'ssl_client_auth = "requested"',
        f"credentials_file = {toml(str(tmp / 'users.json'))}",
        'authorizer = "acl"',
        'super_users = "User:admin"',
    ]
    # One array, an ACL a line: the form a reload takes (a file ending inside an [[acls]]
    # table could be one cut while written: docs/operations.md).
    lines.append("acls = [")
    for acl in acls:
        pairs = ", ".join(f"{key} = {toml(value)}" for key, value in acl.items())
        lines.append(f"  {{ {pairs} }},")
    lines.append("]")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    tmp = tmp_path_factory.mktemp("secured")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    server_cert = ca.issue_cert("localhost", "127.0.0.1")
    server_cert.private_key_pem.write_to_path(str(tmp / "server.key"))
    server_cert.cert_chain_pems[0].write_to_path(str(tmp / "server.pem"))
    for pem in server_cert.cert_chain_pems[1:]:
        pem.write_to_path(str(tmp / "server.pem"), append=True)
    for user, password in PASSWORDS.items():
        add_sasl_user(tmp / "users.json", user, password)
    config = tmp / "pidctl.toml"
    _write_config(config, tmp, ACLS)
    server = ServerProcess(tmp / "data", "--config", str(config))
    with server:
        plain, tls, sasl_tls = (f"127.0.0.1:{port}" for port in server.ports)
        yield Secured(server, ca, tmp, config, plain, tls, sasl_tls)


def sasl_client(secured: Secured, user: str, mechanism: str = "PLAIN") -> SyncClient:
    return SyncClient(secured.sasl_plaintext, sasl=(mechanism, user, PASSWORDS[user]))


# -- SASL ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_mechanisms_authenticate(secured: Secured, mechanism: str) -> None:
    with sasl_client(secured, "producer", mechanism) as client:
        response = client.request(requests.init_producer_id(None))
    assert response.error_code == 0 and response.producer_epoch == 0


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_wrong_password_is_refused_closed_counted_and_not_logged(
    secured: Secured, mechanism: str
) -> None:
    before = scrape(secured.server.metrics_url)
    with pytest.raises(AuthenticationError, match="invalid username or password"):
        SyncClient(secured.sasl_plaintext, sasl=(mechanism, "producer", "not-the-password"))
    with pytest.raises(AuthenticationError):
        SyncClient(secured.sasl_plaintext, sasl=(mechanism, "ghost", "whatever-pw"))
    after = scrape(secured.server.metrics_url)
    key = f'pidctl_authentication_failures_total{{mechanism="{mechanism}"}}'
    assert after[key] - before.get(key, 0) == 2
    wait_until(
        lambda: "authentication failed" in "\n".join(secured.server.stderr_lines),
        "the failure logged",
    )
    logged = "\n".join(secured.server.stderr_lines)
    assert "not-the-password" not in logged and "whatever-pw" not in logged


def test_request_before_authentication_closes_the_connection(secured: Secured) -> None:
    host, port = secured.sasl_plaintext.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(encode_request(requests.init_producer_id(None), 1, "early"))
        assert sock.recv(100) == b""
    with SyncClient(secured.sasl_plaintext) as client:  # ApiVersions is allowed first
        assert client.request(requests.api_versions()).error_code == 0


@pytest.mark.parametrize("mechanism", ["GSSAPI", "plain"])
def test_unknown_mechanism_is_answered_then_closed(secured: Secured, mechanism: str) -> None:
    """As Kafka: names the enabled mechanisms (matched exactly), then closes."""
    with SyncClient(secured.sasl_plaintext) as client:
        response = client.request(requests.sasl_handshake(mechanism))
        with pytest.raises(ConnectionError):
            client.request(requests.api_versions())
    assert response.error_code == ErrorCode.unsupported_sasl_mechanism
    assert set(response.mechanisms) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_librdkafka_over_sasl(secured: Secured, mechanism: str) -> None:
    config = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": "producer",
        "sasl.password": PASSWORDS["producer"],
    }
    pid, epoch = librdkafka_pid(secured.sasl_plaintext, **config, **{"enable.idempotence": True})
    assert pid >= 0 and epoch == 0
    first = librdkafka_pid(
        secured.sasl_plaintext, **config, **{"transactional.id": f"app-{mechanism}"}
    )
    assert first[1] == 0


def test_librdkafka_over_sasl_ssl(secured: Secured) -> None:
    config = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "producer",
        "sasl.password": PASSWORDS["producer"],
        "ssl.ca.location": str(secured.tmp / "ca.pem"),
        "enable.idempotence": True,
    }
    assert librdkafka_pid(secured.sasl_ssl, **config)[1] == 0


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_kafka_python_over_sasl(secured: Secured, mechanism: str) -> None:
    producer = kafka.KafkaProducer(
        bootstrap_servers=secured.sasl_plaintext,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        sasl_plain_username="producer",
        sasl_plain_password=PASSWORDS["producer"],
        transactional_id=f"app-kp-{mechanism}",
    )
    try:
        producer.init_transactions()
        assert kafka_python_pid(producer)[1] == 0
    finally:
        producer.close(1)


def test_kafka_python_wrong_password(secured: Secured) -> None:
    with pytest.raises(kafka.errors.KafkaError):
        producer = kafka.KafkaProducer(
            bootstrap_servers=secured.sasl_plaintext,
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-256",
            sasl_plain_username="producer",
            sasl_plain_password="wrong",
            transactional_id="app-x",
            max_block_ms=3000,
            # The refusal arrives at once, but kafka-python retries the bootstrap until this
            # (30 s by default) before it reports it.
            bootstrap_timeout_ms=3000,
        )
        try:
            producer.init_transactions()
        finally:
            producer.close(1)
    wait_until(
        lambda: any(
            e.get("event") == "authentication failed" and e.get("mechanism") == "SCRAM-SHA-256"
            for e in secured.server.events
        ),
        "the server refused the password",
    )


# -- TLS ----------------------------------------------------------------------------------


def test_tls_without_client_certificate_is_anonymous(secured: Secured) -> None:
    with SyncClient(secured.tls, ssl_context=secured.client_context()) as client:
        assert client.request(requests.api_versions()).error_code == 0
        refused = client.request(wire.registration(7, secured.server.cluster_id()))
    assert refused.error_code == ErrorCode.cluster_authorization_failed


def test_mtls_principal_is_the_certificate_subject(secured: Secured) -> None:
    context = secured.client_context(client_cert="broker-tls")
    with SyncClient(secured.tls, ssl_context=context) as client:
        registered = client.request(wire.registration(8, secured.server.cluster_id()))
    # Kafka's default principal: the whole subject, most specific part first.
    assert registered.error_code == 0  # the ACL names User:CN=broker-tls,OU=brokers,O=acme


def test_plaintext_client_cannot_talk_to_a_tls_listener(secured: Secured) -> None:
    with pytest.raises((ConnectionError, OSError)), SyncClient(secured.tls, timeout=5) as client:
        client.request(requests.api_versions())


def test_librdkafka_over_mtls(secured: Secured) -> None:
    """A librdkafka idempotent producer over TLS with a client certificate whose subject the
    ACLs allow IdempotentWrite; without the certificate the same request is refused."""
    cert = secured.ca.issue_cert(
        "producer-tls",
        common_name="producer-tls",
        organization_name="acme",
        organization_unit_name="apps",
    )
    cert.cert_chain_pems[0].write_to_path(str(secured.tmp / "producer.pem"))
    cert.private_key_pem.write_to_path(str(secured.tmp / "producer.key"))
    config = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(secured.tmp / "ca.pem"),
        "ssl.certificate.location": str(secured.tmp / "producer.pem"),
        "ssl.key.location": str(secured.tmp / "producer.key"),
        "enable.idempotence": True,
    }
    pid, epoch = librdkafka_pid(secured.tls, **config)
    assert pid >= 0 and epoch == 0
    with SyncClient(secured.tls, ssl_context=secured.client_context()) as anonymous:
        refused = anonymous.request(requests.init_producer_id(None))
    assert refused.error_code == ErrorCode.cluster_authorization_failed


# -- ACL matrix ---------------------------------------------------------------------------

OK = ErrorCode.none
CLUSTER_DENIED = ErrorCode.cluster_authorization_failed
TXN_DENIED = ErrorCode.transactional_id_authorization_failed

# API -> expected error per principal (admin is a super user).
MATRIX = {
    "register": {"admin": OK, "broker": OK, "producer": CLUSTER_DENIED, "nobody": CLUSTER_DENIED},
    "heartbeat": {"admin": OK, "broker": OK, "producer": CLUSTER_DENIED, "nobody": CLUSTER_DENIED},
    "allocate": {"admin": OK, "broker": OK, "producer": CLUSTER_DENIED, "nobody": CLUSTER_DENIED},
    # A job's block (BrokerId -1, BrokerEpoch -1, a Spark driver): IdempotentWrite, as for
    # InitProducerId, not the brokers' ClusterAction.
    "job_allocate": {
        "admin": OK,
        "broker": CLUSTER_DENIED,
        "producer": OK,
        "nobody": CLUSTER_DENIED,
    },
    "unregister": {"admin": OK, "broker": OK, "producer": CLUSTER_DENIED, "nobody": CLUSTER_DENIED},
    "idempotent": {"admin": OK, "broker": CLUSTER_DENIED, "producer": OK, "nobody": CLUSTER_DENIED},
    "transactional": {"admin": OK, "broker": TXN_DENIED, "producer": OK, "nobody": TXN_DENIED},
    "denied_transactional": {
        "admin": OK,
        "broker": TXN_DENIED,
        "producer": TXN_DENIED,
        "nobody": TXN_DENIED,
    },
    "find_coordinator": {"admin": OK, "broker": TXN_DENIED, "producer": OK, "nobody": TXN_DENIED},
    "describe_cluster": {
        "admin": OK,
        "broker": OK,
        "producer": CLUSTER_DENIED,
        "nobody": CLUSTER_DENIED,
    },
}


def _call(client: SyncClient, api: str, cluster: str, broker_id: int, epoch: int) -> ErrorCode:
    if api == "register":
        return client.request(wire.registration(broker_id, cluster)).error_code  # type: ignore[no-any-return]
    if api == "heartbeat":
        return client.request(wire.heartbeat(broker_id, epoch)).error_code  # type: ignore[no-any-return]
    if api == "allocate":
        return client.request(wire.allocate(broker_id, epoch)).error_code  # type: ignore[no-any-return]
    if api == "job_allocate":
        return client.request(wire.allocate(-1, -1)).error_code  # type: ignore[no-any-return]
    if api == "unregister":
        return client.request(wire.unregister(broker_id)).error_code  # type: ignore[no-any-return]
    if api == "idempotent":
        return client.request(requests.init_producer_id(None)).error_code  # type: ignore[no-any-return]
    if api == "transactional":
        return client.request(requests.init_producer_id("app-orders")).error_code  # type: ignore[no-any-return]
    if api == "denied_transactional":
        return client.request(requests.init_producer_id("app-secret")).error_code  # type: ignore[no-any-return]
    if api == "find_coordinator":
        return client.request(requests.find_coordinator("app-orders")).coordinators[0].error_code  # type: ignore[no-any-return]
    return client.request(requests.describe_cluster()).error_code  # type: ignore[no-any-return]


@pytest.mark.parametrize("user", sorted(PASSWORDS))
@pytest.mark.parametrize("api", sorted(MATRIX))
def test_acl_matrix(secured: Secured, api: str, user: str) -> None:
    cluster = secured.server.cluster_id()
    broker_id = 100 + sorted(MATRIX).index(api) * 10 + sorted(PASSWORDS).index(user)
    epoch = -1
    if api != "register":
        with sasl_client(secured, "admin") as admin:  # a registered broker to act on
            epoch = int(admin.request(wire.registration(broker_id, cluster)).broker_epoch)
    before = len(_records(secured))
    with sasl_client(secured, user) as client:
        got = _call(client, api, cluster, broker_id, epoch)
    assert got == MATRIX[api][user]
    if api == "job_allocate" and got == OK:  # the grant names who asked
        grant = _records(secured)[-1]
        assert isinstance(grant, ProducerIdsGranted)
        assert (grant.holder, grant.principal) == ("job", f"User:{user}")
    if got != OK:
        assert len(_records(secured)) == before  # a refused request changes nothing


def _records(secured: Secured) -> list[object]:
    from pidctl.controller.log.recovery import read_log

    return [e.record for e in read_log(secured.server.data_dir).entries()]


# -- reload -------------------------------------------------------------------------------


def test_sighup_reloads_acls_and_users(secured: Secured) -> None:
    with sasl_client(secured, "nobody") as client:
        assert client.request(requests.init_producer_id(None)).error_code == CLUSTER_DENIED
    granted = [
        *ACLS,
        {"principal": "User:nobody", "operation": "IdempotentWrite", "resource_type": "Cluster"},
    ]
    _write_config(secured.config, secured.tmp, granted)
    add_sasl_user(secured.tmp / "users.json", "late", "late-pw")
    assert secured.server.proc is not None
    try:
        secured.server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not any(e.get("event") == "configuration reloaded" for e in secured.server.events):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with sasl_client(secured, "nobody") as client:
            assert client.request(requests.init_producer_id(None)).error_code == OK
        with SyncClient(secured.sasl_plaintext, sasl=("SCRAM-SHA-256", "late", "late-pw")):
            pass
    finally:
        reloads = sum(e.get("event") == "configuration reloaded" for e in secured.server.events)
        _write_config(secured.config, secured.tmp, ACLS)
        secured.server.proc.send_signal(signal.SIGHUP)
        wait_until(
            lambda: (
                sum(e.get("event") == "configuration reloaded" for e in secured.server.events)
                > reloads
            ),
            "the original configuration reloaded",
        )


def test_default_server_warns_that_everything_is_allowed(server: ServerProcess) -> None:
    warning = next(e for e in server.events if e.get("event", "").startswith("no authorizer"))
    assert warning["level"] == "warning"
    assert os.environ.get("PIDCTL_AUTHORIZER") is None
