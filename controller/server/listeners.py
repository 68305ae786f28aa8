"""Listener security: TLS contexts and principals from client certificates."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from pidctl.controller.settings import Settings

# Attribute names as Java's X500Principal prints them (Kafka's default principal builder).
_SHORT_NAMES = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
    "emailAddress": "EMAILADDRESS",
}


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")


def server_ssl_context(settings: Settings) -> ssl.SSLContext:
    """TLS 1.2+ with the configured certificate; client certificates per ssl_client_auth."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(
        settings.ssl_certfile, settings.ssl_keyfile, settings.ssl_keyfile_password or None
    )
    if settings.ssl_client_auth != "none":
        context.load_verify_locations(settings.ssl_cafile)
        context.verify_mode = (
            ssl.CERT_REQUIRED if settings.ssl_client_auth == "required" else ssl.CERT_OPTIONAL
        )
    return context


def principal_from_certificate(certificate: dict[str, Any] | None) -> str | None:
    """``User:<subject>`` in RFC 2253 order (most specific first), as Kafka names a TLS client,
    or None without a certificate."""
    if not certificate or not certificate.get("subject"):
        return None
    parts = []
    for rdn in reversed(certificate["subject"]):
        parts.append("+".join(f"{_SHORT_NAMES.get(k, k)}={_escape(v)}" for k, v in rdn))
    return "User:" + ",".join(parts)


def _escape(value: str) -> str:
    for char in '\\,+"<>;=':
        value = value.replace(char, "\\" + char)
    return value
