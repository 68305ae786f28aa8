"""Listener security: TLS contexts (principals from client certificates: ``security/x500.py``)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from pidctl.controller.settings import Settings


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
