"""The client side of SASL PLAIN and SCRAM-SHA-256/512 (RFC 4616, RFC 5802), sans-IO."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Final

#: Each SCRAM mechanism's hash (RFC 7677, RFC 5802): the one table, the server's too.
SCRAM_DIGESTS: Final = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: The SASL mechanisms pidctl speaks, by Kafka's names (the settings name them).
MECHANISMS: Final = ("PLAIN", *SCRAM_DIGESTS)


def plain_token(user: str, password: str) -> bytes:
    """The single PLAIN message: no authorisation id, the user, the password."""
    return b"\0" + user.encode() + b"\0" + password.encode()


class ScramClient:
    """Call :meth:`first`, send it; feed the server's answer to :meth:`final`, send that;
    check the server's last message with :meth:`verify`."""

    def __init__(self, mechanism: str, user: str, password: str) -> None:
        """Start an exchange for ``user`` with ``mechanism`` (SCRAM-SHA-256 or -512)."""
        self.digest = SCRAM_DIGESTS[mechanism]
        self.password = password
        name = user.replace("=", "=3D").replace(",", "=2C")
        self._bare = f"n={name},r={base64.b64encode(secrets.token_bytes(18)).decode()}"
        self._server_signature = b""

    def first(self) -> bytes:
        """The client-first message."""
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        """The client-final message (with the proof) for the server-first message."""
        text = server_first.decode()
        attrs = dict(part.split("=", 1) for part in text.split(","))
        if not attrs["r"].startswith(self._bare.split("r=", 1)[1]):
            raise ValueError("server nonce does not extend ours")
        salted = hashlib.pbkdf2_hmac(
            self.digest, self.password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"])
        )
        client_key = hmac.digest(salted, b"Client Key", self.digest)
        without_proof = f"c={base64.b64encode(b'n,,').decode()},r={attrs['r']}"
        auth = f"{self._bare},{text},{without_proof}".encode()
        stored = hashlib.new(self.digest, client_key).digest()
        signature = hmac.digest(stored, auth, self.digest)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.digest(salted, b"Server Key", self.digest)
        self._server_signature = hmac.digest(server_key, auth, self.digest)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes) -> bool:
        """Whether the server proved it knows the credentials too."""
        return hmac.compare_digest(server_final, b"v=" + base64.b64encode(self._server_signature))
