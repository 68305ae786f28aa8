"""The PID counter shared by a fleet of controllers, kept in etcd (see ``docs/fleets.md``).

One key, ``<prefix>/next_producer_id``, holds the lowest PID no controller has leased, as a
decimal string. A controller takes a lease ``[first, first + size)`` with one transaction:
"if the key's mod_revision is still the one I read, set it to first + size (and record that
end under ``<prefix>/leases/<node id>``); else tell me its current value and the leases
recorded". A counter below a recorded lease went back (deleted, or set back by hand).
Everything goes through etcd's JSON gateway (HTTP/1.1, ``/v3/kv/...``) with httpx, which
runs under trio; no gRPC.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from pidctl.controller.core.errors import PidctlError
from pidctl.protocol.addresses import EtcdLocation


class EtcdError(PidctlError):
    """etcd could not be used (the line names etcd: its messages are etcd's own)."""

    line_prefix = "etcd: "


class EtcdUnavailable(EtcdError):
    """No endpoint answered (or etcd itself could not serve the request, e.g. no leader)."""


class EtcdRefused(EtcdError):
    """etcd answered but refused: bad credentials, permission denied, a malformed counter."""


@dataclass(frozen=True, slots=True)
class Counter:
    """The counter as last seen: its value (0 when the key does not exist yet) and the
    key's mod_revision (0 then), which the next compare-and-swap compares against;
    ``leased``: the highest lease end any controller recorded beside it, read in the same
    transaction (0: none). The counter never goes below it unless it went back."""

    value: int
    mod_revision: int
    leased: int = 0


@dataclass(frozen=True, slots=True)
class Swap:
    """A compare-and-swap's outcome: ``counter`` is the new value if it succeeded, else the
    value another controller left (read in the same transaction); ``revision`` is etcd's."""

    succeeded: bool
    counter: Counter
    revision: int


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class EtcdCounter:
    """The shared counter, over etcd's JSON gateway.

    ``on_request(operation, seconds, failed)`` is told about every round trip (for metrics).
    Endpoints are tried in turn; the one that answered last is tried first next time.
    ``member`` (a controller's node id) records each successful swap under
    ``<prefix>/leases/<member>``; None (``pidctl import-zk``) records nothing.
    """

    def __init__(
        self,
        location: EtcdLocation,
        *,
        ssl_context: ssl.SSLContext | None = None,
        username: str = "",
        password: str = "",
        timeout_s: float = 2.0,
        on_request: Callable[[str, float, bool], None] | None = None,
        member: str | None = None,
    ) -> None:
        self.location = location
        self._key = _b64(location.counter_key)
        self._leases = {
            "key": _b64(location.leases_prefix),
            "range_end": _b64(_prefix_end(location.leases_prefix)),
        }
        self._member_key = _b64(location.leases_prefix + member) if member is not None else None
        self._credentials = (username, password) if username else None
        self._token: str | None = None
        self._preferred = 0
        self._on_request = on_request or (lambda operation, seconds, failed: None)
        scheme = "https" if location.tls else "http"
        self._urls = [f"{scheme}://{endpoint}" for endpoint in location.endpoints]
        verify: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._http = httpx.AsyncClient(timeout=timeout_s, verify=verify)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def read(self) -> Counter:
        """The counter's current value and the leases recorded beside it (one linearizable
        read of both: a transaction with no condition)."""
        reply = await self._call("range", "/v3/kv/txn", {"compare": [], "success": self._reads()})
        return self._seen(reply.get("responses", []))

    def _reads(self) -> list[dict[str, Any]]:
        return [{"request_range": {"key": self._key}}, {"request_range": self._leases}]

    def _seen(self, responses: list[dict[str, Any]]) -> Counter:
        """The counter and the highest lease recorded, from the answers to :meth:`_reads`."""
        kvs = [r.get("response_range", {}).get("kvs", []) for r in responses] + [[], []]
        return _counter(kvs[0], _highest_lease(kvs[1]))

    async def compare_and_swap(self, expected: Counter, value: int) -> Swap:
        """Set the counter to ``value`` if it is still ``expected`` (one etcd transaction)."""
        if expected.mod_revision == 0:
            compare = {
                "key": self._key,
                "target": "CREATE",
                "result": "EQUAL",
                "create_revision": "0",
            }
        else:
            compare = {
                "key": self._key,
                "target": "MOD",
                "result": "EQUAL",
                "mod_revision": str(expected.mod_revision),
            }
        puts = [{"request_put": {"key": self._key, "value": _b64(str(value))}}]
        if self._member_key is not None:
            puts.append({"request_put": {"key": self._member_key, "value": _b64(str(value))}})
        txn = {"compare": [compare], "success": puts, "failure": self._reads()}
        reply = await self._call("txn", "/v3/kv/txn", txn)
        revision = int(reply.get("header", {}).get("revision", 0))
        if reply.get("succeeded", False):  # the gateway leaves out false values
            leased = value if self._member_key is not None else expected.leased
            return Swap(True, Counter(value, revision, leased), revision)
        return Swap(False, self._seen(reply.get("responses", [])), revision)

    async def _call(self, operation: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        errors = []
        count = len(self._urls)
        for attempt in range(count):
            index = (self._preferred + attempt) % count
            url = self._urls[index]
            started = time.perf_counter()
            try:
                reply = await self._post(url, path, body)
            except EtcdUnavailable as e:
                self._on_request(operation, time.perf_counter() - started, True)
                errors.append(f"{url}: {e}")
                continue
            except EtcdRefused:
                self._on_request(operation, time.perf_counter() - started, True)
                raise
            self._on_request(operation, time.perf_counter() - started, False)
            self._preferred = index
            return reply
        raise EtcdUnavailable("; ".join(errors))

    async def _post(self, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._credentials is not None and self._token is None:
            self._token = await self._authenticate(url)
        reply = await self._send(url, path, body)
        if self._credentials is not None and reply.status_code != 200 and "token" in reply.text:
            # The token expired (etcd's simple tokens last 5 minutes, and do not survive a
            # restart of etcd): once more with a new one.
            self._token = await self._authenticate(url)
            reply = await self._send(url, path, body)
        return _json(reply)

    async def _send(self, url: str, path: str, body: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": self._token} if self._token else {}
        try:
            return await self._http.post(url + path, json=body, headers=headers)
        except httpx.HTTPError as e:
            raise EtcdUnavailable(_describe(e)) from e

    async def _authenticate(self, url: str) -> str:
        assert self._credentials is not None
        name, password = self._credentials
        reply = _json(
            await self._send(url, "/v3/auth/authenticate", {"name": name, "password": password})
        )
        token = reply.get("token")
        if not isinstance(token, str):
            raise EtcdRefused("etcd authentication returned no token")
        return token


#: gRPC codes with which etcd says "not now" rather than "no": unavailable, deadline
#: exceeded, aborted, resource exhausted, internal (e.g. "etcdserver: no leader").
_RETRIABLE_GRPC_CODES = {4, 8, 10, 13, 14}


def _json(reply: httpx.Response) -> dict[str, Any]:
    try:
        data = reply.json()
    except json.JSONDecodeError:
        raise EtcdUnavailable(f"HTTP {reply.status_code}, not JSON") from None
    if not isinstance(data, dict):
        raise EtcdUnavailable(f"HTTP {reply.status_code}, unexpected reply")
    if reply.status_code == 200:
        return data
    message = str(data.get("error") or data.get("message") or reply.text)
    if data.get("code") in _RETRIABLE_GRPC_CODES or reply.status_code >= 500:
        raise EtcdUnavailable(message)
    raise EtcdRefused(message)


def _describe(error: BaseException) -> str:
    """The error's name and the first non-empty message down its chain (httpx's errors
    under trio often carry theirs only in the cause, e.g. a certificate problem)."""
    cause: BaseException | None = error
    while cause is not None and not str(cause):
        cause = cause.__cause__ or cause.__context__
    return f"{type(error).__name__}: {cause}" if cause is not None else type(error).__name__


def _counter(kvs: list[dict[str, Any]], leased: int = 0) -> Counter:
    if not kvs:
        return Counter(0, 0, leased)
    text = base64.b64decode(kvs[0].get("value", "")).decode(errors="replace")
    if not text.isdigit():
        raise EtcdRefused(f"the counter holds {text!r}, not a producer id")
    return Counter(int(text), int(kvs[0]["mod_revision"]), leased)


def _highest_lease(kvs: list[dict[str, Any]]) -> int:
    """The highest lease end recorded under ``<prefix>/leases/``; a value that is no number
    is refused (retried, as a counter that is no number), naming the key."""
    highest = 0
    for kv in kvs:
        text = base64.b64decode(kv.get("value", "")).decode(errors="replace")
        if not text.isdigit():
            key = base64.b64decode(kv.get("key", "")).decode(errors="replace")
            raise EtcdRefused(f"{key} holds {text!r}, not a producer id")
        highest = max(highest, int(text))
    return highest


def _prefix_end(prefix: str) -> str:
    """etcd's range_end for every key starting with ``prefix`` (its last byte plus one)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)
