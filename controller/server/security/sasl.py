"""SASL PLAIN and SCRAM-SHA-256/512 (RFC 4616, RFC 5802/7677) on the server side, pure.

Credentials are stored as SCRAM keys (salt, iterations, StoredKey, ServerKey), never as
passwords; PLAIN checks a password by deriving the same keys. The credentials file is JSON::

    {"users": {"alice": {"SCRAM-SHA-256": {"salt": "..", "iterations": 4096,
                                           "stored_key": "..", "server_key": ".."}}}}
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pidctl.protocol.sasl_client import SCRAM_DIGESTS

#: The SCRAM mechanisms served, each with its hash (the same table as the client's).
SCRAM_MECHANISMS = SCRAM_DIGESTS
#: Kafka's minimum (and default) SCRAM iteration count.
MIN_ITERATIONS = 4096


class AuthenticationFailed(Exception):
    """The client could not be authenticated; the message is safe to send back."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def create(
        cls,
        password: str,
        mechanism: str,
        iterations: int = MIN_ITERATIONS,
        salt: bytes | None = None,
    ) -> ScramCredential:
        digest = SCRAM_MECHANISMS[mechanism]
        salt = salt or secrets.token_bytes(32)
        salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", digest)
        return cls(
            salt,
            iterations,
            hashlib.new(digest, client_key).digest(),
            hmac.digest(salted, b"Server Key", digest),
        )

    def to_json(self) -> dict[str, object]:
        return {
            "salt": base64.b64encode(self.salt).decode(),
            "iterations": self.iterations,
            "stored_key": base64.b64encode(self.stored_key).decode(),
            "server_key": base64.b64encode(self.server_key).decode(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ScramCredential:
        return cls(
            base64.b64decode(str(data["salt"])),
            int(str(data["iterations"])),
            base64.b64decode(str(data["stored_key"])),
            base64.b64decode(str(data["server_key"])),
        )


class CredentialStore:
    """Users and their SCRAM credentials (per mechanism)."""

    def __init__(self, users: dict[str, dict[str, ScramCredential]] | None = None) -> None:
        self.users = users or {}

    @classmethod
    def load(cls, path: Path) -> CredentialStore:
        if not path.exists():
            return cls()
        try:
            data = json.loads(path.read_text())
            users = _object(data, "the file")["users"]
            return cls(
                {
                    str(user): {
                        str(m): ScramCredential.from_json(_object(c, f"{user}'s {m}"))
                        for m, c in _object(mechanisms, f"user {user!r}").items()
                    }
                    for user, mechanisms in _object(users, "users").items()
                }
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"credentials file {path}: {e}") from e

    def save(self, path: Path) -> None:
        """Atomically, readable by the owner only."""
        data = {
            "users": {
                u: {m: c.to_json() for m, c in ms.items()} for u, ms in sorted(self.users.items())
            }
        }
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        return self.users.get(user, {}).get(mechanism)

    def check_password(self, user: str, password: str) -> bool:
        """PLAIN: derive the stored keys from the password and compare (constant time)."""
        for mechanism, credential in self.users.get(user, {}).items():
            derived = ScramCredential.create(
                password, mechanism, credential.iterations, credential.salt
            )
            return hmac.compare_digest(derived.stored_key, credential.stored_key)
        return False


def _object(value: object, what: str) -> dict[str, Any]:
    """``value`` if it is a JSON object; ValueError naming ``what`` otherwise."""
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object, not {type(value).__name__}")
    return value


#: Kafka's PlainSaslServer and ScramSaslServer refuse an authorization id other than the
#: authenticated user with this message.
AUTHZID_MISMATCH = (
    "Authentication failed: Client requested an authorization id that is different from username"
)


def parse_plain(message: bytes) -> tuple[str, str]:
    """RFC 4616: [authzid] NUL authcid NUL passwd; returns (user, password)."""
    parts = message.split(b"\0")
    if len(parts) != 3 or not parts[1]:
        raise AuthenticationFailed("Authentication failed: invalid PLAIN message")
    authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
    if authzid and authzid != user:
        raise AuthenticationFailed(AUTHZID_MISMATCH)
    return user, password


def _attributes(message: str) -> dict[str, str]:
    attributes = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            raise AuthenticationFailed("Authentication failed: malformed SCRAM message")
        attributes[key] = value
    return attributes


def _unescape(name: str) -> str:
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """One SCRAM exchange: ``first`` takes client-first and returns server-first; ``final``
    takes client-final and returns server-final, setting ``user`` on success."""

    def __init__(self, mechanism: str, store: CredentialStore) -> None:
        self.digest = SCRAM_MECHANISMS[mechanism]
        self.mechanism = mechanism
        self.store = store
        self.user: str | None = None
        self._gs2_header = ""
        self._state: tuple[str, str, str, ScramCredential] | None = None

    def first(self, message: bytes) -> bytes:
        text = message.decode("utf-8", "replace")
        gs2, sep, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if gs2 not in ("n", "y") or not sep or not sep2:
            raise AuthenticationFailed("Authentication failed: malformed SCRAM client-first")
        attributes = _attributes(bare)
        user = _unescape(attributes.get("n", ""))
        client_nonce = attributes.get("r", "")
        if not user or not client_nonce:
            raise AuthenticationFailed("Authentication failed: malformed SCRAM client-first")
        if authzid:
            if not authzid.startswith("a="):
                raise AuthenticationFailed("Authentication failed: malformed SCRAM client-first")
            if _unescape(authzid[2:]) != user:
                raise AuthenticationFailed(AUTHZID_MISMATCH)
        credential = self.store.credential(user, self.mechanism)
        if credential is None or credential.iterations < MIN_ITERATIONS:
            raise AuthenticationFailed("Authentication failed: invalid username or password")
        nonce = client_nonce + base64.b64encode(secrets.token_bytes(18)).decode()
        server_first = (
            f"r={nonce},s={base64.b64encode(credential.salt).decode()},i={credential.iterations}"
        )
        self._gs2_header = f"{gs2},{authzid},"
        self._state = (user, bare, server_first, credential)
        return server_first.encode()

    def final(self, message: bytes) -> bytes:
        if self._state is None:
            raise AuthenticationFailed("Authentication failed: SCRAM messages out of order")
        user, client_first_bare, server_first, credential = self._state
        text = message.decode("utf-8", "replace")
        without_proof, sep, proof_part = text.rpartition(",p=")
        attributes = _attributes(without_proof)
        expected_nonce = _attributes(server_first)["r"]
        channel_binding = base64.b64encode(self._gs2_header.encode()).decode()
        if (
            not sep
            or attributes.get("r") != expected_nonce
            or attributes.get("c") != channel_binding
        ):
            raise AuthenticationFailed("Authentication failed: invalid username or password")
        auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
        signature = hmac.digest(credential.stored_key, auth_message, self.digest)
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise AuthenticationFailed("Authentication failed: malformed proof") from None
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        stored = hashlib.new(self.digest, client_key).digest()
        if len(proof) != len(signature) or not hmac.compare_digest(stored, credential.stored_key):
            raise AuthenticationFailed("Authentication failed: invalid username or password")
        self.user = user
        server_signature = hmac.digest(credential.server_key, auth_message, self.digest)
        return b"v=" + base64.b64encode(server_signature)
