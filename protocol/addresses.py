"""Addresses as Kafka spells them: ``HOST:PORT`` and listeners ``NAME://HOST:PORT``.

The one parser for both, used by settings, bootstrap strings, broker registrations and
``--pid-source``. IPv6 hosts are written in brackets (``[::1]:9093``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


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


#: The counter key, under the source's prefix.
COUNTER_KEY: Final = "next_producer_id"
#: Under the source's prefix: one key per controller (its node id), the end of the last lease
#: it took, written in the transaction that took it.
LEASES_PREFIX: Final = "leases/"
#: ``--pid-source`` schemes, and the scheme of etcd's JSON gateway each means.
SCHEMES: Final = {"etcd": "http", "etcds": "https"}


@dataclass(frozen=True, slots=True)
class EtcdLocation:
    """``etcd://HOST:PORT[,HOST:PORT...]/PREFIX`` (``etcds://`` for TLS), parsed."""

    endpoints: tuple[HostPort, ...]
    prefix: str
    tls: bool = False

    @classmethod
    def parse(cls, text: str) -> EtcdLocation:
        scheme, sep, rest = text.partition("://")
        if not sep or scheme not in SCHEMES:
            raise ValueError(f"expected etcd://HOST:PORT[,HOST:PORT...]/PREFIX, got {text!r}")
        hosts, slash, prefix = rest.partition("/")
        prefix = prefix.strip("/")
        if not slash or not prefix:
            raise ValueError(f"{text!r} names no key prefix (etcd://HOST:PORT/PREFIX)")
        endpoints = tuple(HostPort.parse(h.strip()) for h in hosts.split(",") if h.strip())
        if not endpoints:
            raise ValueError(f"{text!r} names no etcd endpoint")
        return cls(endpoints, prefix, scheme == "etcds")

    @property
    def counter_key(self) -> str:
        return f"{self.prefix}/{COUNTER_KEY}"

    @property
    def leases_prefix(self) -> str:
        return f"{self.prefix}/{LEASES_PREFIX}"

    def __str__(self) -> str:
        scheme = "etcds" if self.tls else "etcd"
        return f"{scheme}://{','.join(map(str, self.endpoints))}/{self.prefix}"
