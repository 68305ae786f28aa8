from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

import pytest

from pidctl.controller.server.security.sasl import (
    AuthenticationFailed,
    CredentialStore,
    ScramCredential,
    ScramServer,
    parse_plain,
)


def scram_client(mechanism: str, user: str, password: str, server: ScramServer) -> bytes:
    """A straightforward RFC 5802 client, to drive the server."""
    digest = mechanism.removeprefix("SCRAM-").replace("-", "").lower()
    bare = f"n={user},r=clientnonce"
    server_first = server.first(f"n,,{bare}".encode()).decode()
    attrs = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        digest, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
    )
    client_key = hmac.digest(salted, b"Client Key", digest)
    without_proof = f"c={base64.b64encode(b'n,,').decode()},r={attrs['r']}"
    auth = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(hashlib.new(digest, client_key).digest(), auth, digest)
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    final = server.final(f"{without_proof},p={proof.decode()}".encode())
    expected = hmac.digest(hmac.digest(salted, b"Server Key", digest), auth, digest)
    assert final == b"v=" + base64.b64encode(expected)
    return final


@pytest.fixture
def store() -> CredentialStore:
    return CredentialStore(
        {
            "alice": {
                m: ScramCredential.create("wonderland", m)
                for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")
            }
        }
    )


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_exchange(store: CredentialStore, mechanism: str) -> None:
    server = ScramServer(mechanism, store)
    scram_client(mechanism, "alice", "wonderland", server)
    assert server.user == "alice"


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("bob", "wonderland")])
def test_scram_refuses_bad_credentials(store: CredentialStore, user: str, password: str) -> None:
    with pytest.raises(AuthenticationFailed, match="invalid username or password"):
        scram_client("SCRAM-SHA-256", user, password, ScramServer("SCRAM-SHA-256", store))


def test_scram_refuses_garbage_and_out_of_order(store: CredentialStore) -> None:
    with pytest.raises(AuthenticationFailed):
        ScramServer("SCRAM-SHA-256", store).first(b"garbage")
    with pytest.raises(AuthenticationFailed):
        ScramServer("SCRAM-SHA-256", store).final(b"c=biws,r=x,p=AAAA")


def test_plain_checks_against_scram_keys(store: CredentialStore) -> None:
    assert parse_plain(b"\0alice\0wonderland") == ("alice", "wonderland")
    assert store.check_password("alice", "wonderland")
    assert not store.check_password("alice", "wonderlanD")
    assert not store.check_password("nobody", "x")
    with pytest.raises(AuthenticationFailed):
        parse_plain(b"alice:wonderland")
    with pytest.raises(AuthenticationFailed):
        parse_plain(b"mallory\0alice\0wonderland")  # acting for someone else


def test_store_round_trip_never_holds_the_password(store: CredentialStore, tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    store.save(path)
    assert "wonderland" not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    loaded = CredentialStore.load(path)
    assert loaded.users == store.users


@pytest.mark.parametrize(
    "text",
    ['{"users": []}', '{"users": {"a": []}}', '{"users": {"a": {"PLAIN": 3}}}', "[]", "{"],
)
def test_a_credentials_file_of_the_wrong_shape_is_a_value_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "users.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="credentials file"):
        CredentialStore.load(path)
