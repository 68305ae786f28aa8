"""Addresses as Kafka spells them: ``HOST:PORT`` and listeners ``NAME://HOST:PORT``.

The one parser for both, used by settings, bootstrap strings, broker registrations and
``--pid-source``. IPv6 hosts are written in brackets (``[::1]:9093``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> HostPort:
        """``HOST:PORT`` (port 0 to 65535); raises ValueError naming what was given."""
        host, sep, port = text.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"expected HOST:PORT, got {text!r}")
        return cls(host.strip("[]"), int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listener(text: str) -> tuple[str, HostPort]:
    """``NAME://HOST:PORT`` to (NAME, address); raises ValueError naming what was given."""
    name, sep, address = text.strip().partition("://")
    if not sep or not name:
        raise ValueError(f"expected NAME://HOST:PORT, got {text!r}")
    try:
        return name, HostPort.parse(address)
    except ValueError:
        raise ValueError(f"expected NAME://HOST:PORT, got {text!r}") from None


def parse_listeners(text: str) -> list[tuple[str, HostPort]]:
    """A comma-separated list of listeners; raises ValueError for an empty one."""
    listeners = [parse_listener(item) for item in text.split(",") if item.strip()]
    if not listeners:
        raise ValueError("no listener given")
    return listeners
