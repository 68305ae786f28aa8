"""Hostile but well-formed requests, and principals that must be matched exactly: against
the real server, with real certificates (trustme) and real SASL exchanges."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import trustme
from kio.schema.find_coordinator.v4 import FindCoordinatorRequest
from kio.schema.metadata.v0 import MetadataRequest
from kio.schema.metadata.v0.request import MetadataRequestTopic
from kio.schema.types import TopicName
from kio.static.primitive import i8

from ops.testing.serverproc import ServerProcess, add_sasl_user, wait_until
from pidctl.client import SyncClient
from pidctl.protocol import requests
from pidctl.protocol.codec import decode_response, encode_request
from pidctl.protocol.sasl_client import ScramClient
from tests import latency


def _read_frame(sock: socket.socket) -> bytes:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    (size,) = struct.unpack(">i", exactly(4))
    return exactly(size)


def test_expensive_requests_are_bounded_and_others_are_served_meanwhile(
    server: ServerProcess,
) -> None:
    # A million keys of one byte each fill a 1 MiB frame; Metadata v0 names 100,000 topics.
    keys = FindCoordinatorRequest(key_type=i8(0), coordinator_keys=("",) * 1_000_000)
    topics = MetadataRequest(
        topics=tuple(MetadataRequestTopic(name=TopicName("t")) for _ in range(100_000))
    )
    attacks = [
        (encode_request(keys, 1, "attacker"), keys),
        (encode_request(topics, 2, "attacker"), topics),
    ]
    answers: list[object] = []
    stop = threading.Event()

    def attack() -> None:
        body: Any
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            while not stop.is_set():
                for frame, body in attacks:
                    sock.sendall(frame)
                    answer = _read_frame(sock)
                    answers.append(decode_response(answer, body.__api_key__, body.__version__))

    with SyncClient(server.bootstrap) as client:

        def well_behaved() -> None:
            assert client.request(requests.init_producer_id()).error_code == 0

        baseline = latency.measure(well_behaved, 300)  # the same client, before the attack
        attacker = threading.Thread(target=attack)
        attacker.start()
        try:
            wait_until(lambda: len(answers) >= 2, "the first attacks answered")
            attacked = latency.measure_while(well_behaved, 300, lambda: len(answers) >= 10)
        finally:
            stop.set()
            attacker.join(60)
    # The 99th percentile: a busy machine may deschedule any process now and then, but an
    # attack that held the event loop (48 s for these keys before the bound) shows in most
    # answers, not in a few; against the baseline of the same run (tests/latency.py), not a
    # fixed figure alone, which a busy machine does not keep.
    assert attacked.p99 < latency.bound(baseline), (attacked.p99, baseline.p99)
    coordinators = [a for a in answers if hasattr(a, "coordinators")]
    (refusal,) = coordinators[0].coordinators
    assert refusal.error_code == 42 and "max_coordinator_keys" in refusal.error_message
    metadata = [a for a in answers if hasattr(a, "topics")]
    assert [t.error_code for t in metadata[0].topics] == [42]


def test_requests_within_the_bounds_are_answered_in_full(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "d", "--max-coordinator-keys", "3")
    with server, SyncClient(server.bootstrap) as client:
        within = FindCoordinatorRequest(key_type=i8(1), coordinator_keys=("a", "b", "c"))
        assert [c.key for c in client.request(within).coordinators] == ["a", "b", "c"]
        over = FindCoordinatorRequest(key_type=i8(1), coordinator_keys=("a", "b", "c", "d"))
        (refusal,) = client.request(over).coordinators
        assert refusal.error_code == 42


# -- principals ---------------------------------------------------------------------------


def _tls_server(tmp_path: Path, ca: trustme.CA, *extra: str) -> ServerProcess:
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "server.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "server.pem"))
    files = {"certfile": "server.pem", "keyfile": "server.key", "cafile": "ca.pem"}
    tls = [arg for name, file in files.items() for arg in (f"--ssl-{name}", str(tmp_path / file))]
    return ServerProcess(
        tmp_path / "d",
        "--listeners",
        "SSL://127.0.0.1:0",
        *tls,
        "--ssl-client-auth",
        "required",
        "--authorizer",
        "acl",
        *extra,
    )


def _client(server: ServerProcess, ca: trustme.CA, **subject: str) -> SyncClient:
    import ssl

    context = ssl.create_default_context()
    ca.configure_trust(context)
    # A certificate needs one subject alternative name (cryptography 51 refuses none); the
    # principal is the subject's distinguished name, which the name does not change.
    ca.issue_cert("client.example", **subject).configure_cert(context)  # type: ignore[arg-type]
    return SyncClient(server.bootstrap, ssl_context=context)


def test_super_users_are_separated_by_semicolons_and_matched_whole(tmp_path: Path) -> None:
    ca = trustme.CA()
    admin = "User:CN=admin,OU=ops,O=acme"
    with _tls_server(tmp_path, ca, "--super-users", f"{admin};User:alice") as server:
        cluster = server.cluster_id()
        real = {
            "common_name": "admin",
            "organization_unit_name": "ops",
            "organization_name": "acme",
        }
        with _client(server, ca, **real) as client:
            assert client.request(requests.registration(1, cluster)).error_code == 0
        # The same CN in another organisation is not the super user (it used to be).
        forged = {
            "common_name": "admin",
            "organization_unit_name": "ops",
            "organization_name": "evil",
        }
        with _client(server, ca, **forged) as client:
            assert client.request(requests.registration(2, cluster)).error_code == 31
        only_cn = {"common_name": "admin"}
        with _client(server, ca, **only_cn) as client:
            assert client.request(requests.registration(3, cluster)).error_code == 31


def _serve_command(tmp_path: Path, config: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pidctl.controller.cli",
        "serve",
        "--config",
        str(config),
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--data-dir",
        str(tmp_path / "d"),
    ]


BAD_ACLS = [
    (
        'resource_type = "TransactionalId"\nresource_name = ""\npattern_type = "prefixed"\n'
        'operation = "Write"',
        "resource_name is empty",
    ),
    ('resource_type = "TransactionalId"\noperation = "Write"', "lacks 'resource_name'"),
    (
        'resource_type = "TransactionalId"\nresource_name = "x"\noperation = "ClusterAction"',
        "does not apply to TransactionalId",
    ),
]


@pytest.mark.parametrize(("acl", "says"), BAD_ACLS)
def test_a_malformed_acl_stops_start_up_naming_it(tmp_path: Path, acl: str, says: str) -> None:
    config = tmp_path / "pidctl.toml"
    config.write_text(f'authorizer = "acl"\n[[acls]]\nprincipal = "User:a"\n{acl}\n')
    started = subprocess.run(
        _serve_command(tmp_path, config), capture_output=True, text=True, timeout=60
    )
    assert started.returncode == 2
    (line,) = started.stderr.strip().splitlines()
    assert line.startswith("pidctl: ") and says in line and "User:a" in line


def test_a_malformed_acl_on_sighup_keeps_the_old_ones(tmp_path: Path) -> None:
    config = tmp_path / "pidctl.toml"
    good = (
        'authorizer = "acl"\n[[acls]]\nprincipal = "User:ANONYMOUS"\n'
        'operation = "IdempotentWrite"\nresource_type = "Cluster"\n'
    )
    config.write_text(good)
    with ServerProcess(tmp_path / "d", "--config", str(config)) as server:
        with SyncClient(server.bootstrap) as client:
            assert client.request(requests.init_producer_id()).error_code == 0
        config.write_text(good + '[[acls]]\nprincipal = "User:ANONYMOUS"\n' + BAD_ACLS[0][0])
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)
        wait_until(
            lambda: any(e.get("event", "").startswith("reload failed") for e in server.events),
            "the refusal logged",
        )
        refusal = next(e for e in server.events if e.get("event", "").startswith("reload failed"))
        assert "resource_name is empty" in refusal["error"]
        with SyncClient(server.bootstrap) as client:  # the old ACLs are still in force
            assert client.request(requests.init_producer_id()).error_code == 0


# -- SASL authorization ids ----------------------------------------------------------------


def sasl_plaintext_server(tmp_path: Path, *users: str) -> ServerProcess:
    """A server (not started) with one SASL_PLAINTEXT listener and ``users`` (each with the
    password ``<user>-pw``) in ``tmp_path/users.json``."""
    credentials = tmp_path / "users.json"
    for user in users:
        add_sasl_user(credentials, user, f"{user}-pw")
    return ServerProcess(
        tmp_path / "d",
        "--listeners",
        "SASL_PLAINTEXT://127.0.0.1:0",
        "--credentials-file",
        str(credentials),
    )


@pytest.fixture
def sasl_server(tmp_path: Path) -> ServerProcess:
    return sasl_plaintext_server(tmp_path, "alice", "mallory")


def _authenticate(server: ServerProcess, mechanism: str, first: bytes) -> tuple[int, str]:
    with SyncClient(server.bootstrap) as client:
        assert client.request(requests.sasl_handshake(mechanism)).error_code == 0
        answer = client.request(requests.sasl_authenticate(first))
        return int(answer.error_code), str(answer.error_message)


def test_plain_authorization_id_other_than_the_user_is_refused(sasl_server: ServerProcess) -> None:
    with sasl_server as server:
        error, message = _authenticate(server, "PLAIN", b"alice\0mallory\0mallory-pw")
        assert error == 58  # SASL_AUTHENTICATION_FAILED
        assert "authorization id that is different from username" in message
        assert _authenticate(server, "PLAIN", b"mallory\0mallory\0mallory-pw")[0] == 0


def test_scram_authorization_id_other_than_the_user_is_refused(sasl_server: ServerProcess) -> None:
    with sasl_server as server:
        bare = ScramClient("SCRAM-SHA-256", "mallory", "mallory-pw").first().split(b",", 2)[2]
        error, message = _authenticate(server, "SCRAM-SHA-256", b"n,a=alice," + bare)
        assert error == 58
        assert "authorization id that is different from username" in message
        error, _ = _authenticate(server, "SCRAM-SHA-256", b"n,a=mallory," + bare)
        assert error == 0  # the same user named as authorization id is fine


def _client_with_subject(
    server: ServerProcess, ca: trustme.CA, tmp_path: Path, subject: list[Any]
) -> tuple[SyncClient, str]:
    """A TLS client whose certificate, signed by ``ca``, has this subject; and the name
    Java gives that subject (what Kafka would call the client)."""
    import datetime
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from tests.controller.server.security.test_x500 import java_names

    ca_key: Any = serialization.load_pem_private_key(ca.private_key_pem.bytes(), None)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem.bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())
    )
    (cert_file, key_file) = tmp_path / "client.pem", tmp_path / "client.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (java_name,) = java_names(tmp_path, [cert.public_bytes(serialization.Encoding.DER)])
    context = ssl.create_default_context()
    ca.configure_trust(context)
    context.load_cert_chain(str(cert_file), str(key_file))
    return SyncClient(server.bootstrap, ssl_context=context), java_name


def test_mtls_principals_are_the_names_java_gives_them(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    attribute = x509.NameAttribute
    subject = [
        x509.RelativeDistinguishedName([attribute(NameOID.ORGANIZATION_NAME, "acme")]),
        x509.RelativeDistinguishedName([attribute(NameOID.EMAIL_ADDRESS, "ops@acme.example")]),
        x509.RelativeDistinguishedName([attribute(NameOID.COMMON_NAME, "#broker 1 ")]),
    ]
    ca = trustme.CA()
    # Everyone may act as a broker, except (a deny ACL copied from Kafka) this one client.
    config = tmp_path / "pidctl.toml"
    probe = _tls_server(tmp_path, ca)
    with probe:
        client, java_name = _client_with_subject(probe, ca, tmp_path, subject)
        client.close()
    principal = f"User:{java_name}"
    config.write_text(
        "[[acls]]\n"
        'principal = "User:*"\noperation = "ClusterAction"\nresource_type = "Cluster"\n'
        "[[acls]]\n"
        f'principal = {json.dumps(principal)}\noperation = "ClusterAction"\n'
        'resource_type = "Cluster"\npermission = "deny"\n'
    )
    with _tls_server(tmp_path, ca, "--config", str(config)) as server:
        cluster = server.cluster_id()
        client, _ = _client_with_subject(server, ca, tmp_path, subject)
        with client:
            # Denied: the deny ACL names the client as Kafka does (it used to fail open).
            assert client.request(requests.registration(1, cluster)).error_code == 31
        other = [x509.RelativeDistinguishedName([attribute(NameOID.COMMON_NAME, "broker 2")])]
        client, _ = _client_with_subject(server, ca, tmp_path, other)
        with client:
            assert client.request(requests.registration(2, cluster)).error_code == 0
    assert (
        java_name
        == "CN=\\#broker 1\\ ,1.2.840.113549.1.9.1=#16106f70734061636d652e6578616d706c65,O=acme"
    )
