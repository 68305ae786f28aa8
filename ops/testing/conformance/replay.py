"""Replaying a case against a server, and normalising its answers for comparison.

An answer becomes plain JSON (kio entities field by field, error codes as numbers, times in
milliseconds), then only what legitimately differs between two servers is normalised:

- producer ids, AllocateProducerIds' block starts and broker epochs become labels in the
  order each distinct value first appears in the case (``P0``, ``P1``; ``B0``; ``E0``):
  what is compared is which answers share a value, not the value (Kafka's depend on what its
  log and other tests did before; blocks need not be contiguous on a shared node);
- node ids, ports, the server's cluster id and the finalized-features epoch become
  ``<node>``, ``<port>``, ``<cluster>``, ``<features-epoch>``; throttle times are dropped;
- the names a replay makes unique (transactional ids, groups, topics, broker ids, incarnation
  ids) become their symbols (``<name:t>``, ``<broker:0>``);
- an error message is compared as absent (null), empty, or present (``<message>``): Kafka's
  wording embeds connection ids and offsets;
- a list longer than :data:`SUMMARY_LENGTH` becomes its length and its error codes.

Everything else (error codes, epochs, flags, version ranges, hosts) is compared as it is.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import itertools
import socket
import ssl
import struct
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ops.testing.conformance.corpus import Case, Context, Raw, Step
from pidctl.client import SyncClient
from pidctl.protocol.apis import ApiKey
from pidctl.protocol.codec import decode_response

#: A list longer than this is summarised (count and error codes), so golden files stay small.
SUMMARY_LENGTH = 20
#: A string longer than this is shortened in golden files.
STRING_LENGTH = 120
#: Requests of a repeated step in flight at once on its connection.
PIPELINE_WINDOW = 64
#: How long one answer may take (Kafka on a busy machine).
ANSWER_TIMEOUT_S = 120.0

Json = Any


@dataclass(frozen=True)
class Target:
    """Where a case is replayed: a server's two listeners (the same address for pidctl),
    its cluster id, the SASL credentials to log in with, if any, and TLS, if it is on."""

    name: str
    broker: str
    controller: str
    cluster_id: str
    sasl: tuple[str, str, str] | None = None
    #: A TLS listener's client context (None: plain TCP).
    tls: ssl.SSLContext | None = None


def plain(value: Any) -> Json:
    """A kio entity (or any value in one) as plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, enum.Enum):
        return int(value.value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, tuple | list | frozenset):
        return [plain(item) for item in value]
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot make {type(value).__name__} plain: {value!r}")


class _Labels:
    """Distinct values in the order they first appear: P0, P1, ..."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.seen: dict[int, str] = {}

    def __call__(self, value: int) -> str:
        return self.seen.setdefault(value, f"{self.prefix}{len(self.seen)}")


class Normaliser:
    """Normalises one case's requests and answers against one server (labels are shared by
    the whole case)."""

    def __init__(self, ctx: Context, target: Target) -> None:
        self.ctx = ctx
        self.target = target
        self.pids = _Labels("P")
        self.blocks = _Labels("B")
        self.epochs = _Labels("E")

    def request(self, body: Any) -> Json:
        """A request as the golden file shows it."""
        if isinstance(body, Raw):
            raw: Json = {"api": _api_name(body.api_key), "version": body.version, "raw": True}
            if body.client_id is not None:
                raw["client_id"] = body.client_id.hex()
            if body.header_tags is not None:
                raw["header_tags"] = body.header_tags.hex()
            return raw
        fields = self._walk(plain(body), answer=False)
        return {"api": _api_name(body.__api_key__), "version": int(body.__version__), **fields}

    def answer(self, body: Any) -> Json:
        """An answer, normalised for comparison."""
        return self._walk(plain(body), answer=True)

    def _walk(self, value: Json, *, answer: bool, key: str = "", parent: Json = None) -> Json:
        if isinstance(value, dict):
            out = {}
            for name, item in value.items():
                if name == "throttle_time":
                    continue
                out[name] = self._field(name, item, value, answer=answer)
            return out
        if isinstance(value, list):
            return self._list(key, value, answer=answer)
        if isinstance(value, str):
            return self._string(value)
        return value

    def _field(self, name: str, value: Json, parent: Json, *, answer: bool) -> Json:
        if isinstance(value, int) and not isinstance(value, bool):
            return self._number(name, value, parent, answer=answer)
        if name == "error_message":
            return value if value in (None, "") else "<message>"
        if name == "cluster_id" and value == self.target.cluster_id:
            return "<cluster>"
        if name in ("api_keys", "supported_features", "finalized_features", "features"):
            return self._ranges(name, value)
        return self._walk(value, answer=answer, key=name, parent=parent)

    def _number(self, name: str, value: int, parent: Json, *, answer: bool) -> Json:
        if name == "producer_id" and value >= 0:
            return self.pids(value)
        if name == "producer_id_start" and parent.get("error_code", 0) == 0:
            return self.blocks(value)
        if name in ("broker_epoch", "current_metadata_offset") and value > 0:
            return self.epochs(value)
        if name == "broker_id" and value in self.ctx.symbols:
            return self.ctx.symbols[value]
        if name == "broker_id" and -value in self.ctx.symbols:
            return "-" + self.ctx.symbols[-value]
        if answer and name in ("node_id", "controller_id") and value >= 0:
            return "<node>"
        if answer and name == "port" and value > 0:
            return "<port>"
        if name == "finalized_features_epoch" and value >= 0:
            return "<features-epoch>"
        return value

    def _ranges(self, name: str, entries: list[dict[str, Any]]) -> dict[str, str]:
        """ApiVersions' lists (and a registration's features) as {key: "min..max"}."""
        if name == "api_keys":
            return {str(e["api_key"]): f"{e['min_version']}..{e['max_version']}" for e in entries}
        if name == "supported_features":
            return {e["name"]: f"{e['min_version']}..{e['max_version']}" for e in entries}
        if name == "features":  # a BrokerRegistration's
            return {
                e["name"]: f"{e['min_supported_version']}..{e['max_supported_version']}"
                for e in entries
            }
        return {e["name"]: f"{e['min_version_level']}..{e['max_version_level']}" for e in entries}

    def _list(self, key: str, items: list[Json], *, answer: bool) -> Json:
        if len(items) <= SUMMARY_LENGTH:
            return [self._walk(item, answer=answer, key=key) for item in items]
        codes = Counter(str(item.get("error_code")) for item in items if isinstance(item, dict))
        summary: dict[str, Any] = {"count": len(items)}
        if answer and codes:
            summary["error_codes"] = dict(sorted(codes.items()))
        return summary

    def string(self, text: str) -> str:
        """A string with this replay's names as their symbols, shortened if long."""
        return self._string(text)

    def _string(self, text: str) -> str:
        # Longest first: one generated name may begin with another ("...-t", "...-topic").
        names = sorted(
            (
                (str(value), symbol)
                for value, symbol in self.ctx.symbols.items()
                if isinstance(value, str | uuid.UUID)
            ),
            key=lambda item: -len(item[0]),
        )
        for value, symbol in names:
            if value in text:
                text = text.replace(value, symbol)
        if len(text) > STRING_LENGTH:
            return f"<{len(text)} characters: {text[:40]}...>"
        return text


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return str(api_key)


def summarise(answers: list[Json]) -> Json:
    """What a repeated step's answers were: how many, their error codes, the producer ids
    and epochs they carried."""
    summary: dict[str, Any] = {
        "count": len(answers),
        "error_codes": dict(sorted(Counter(str(a.get("error_code")) for a in answers).items())),
    }
    pids = list(dict.fromkeys(a["producer_id"] for a in answers if "producer_id" in a))
    if pids:
        summary["producer_ids"] = pids
    epochs = [a["producer_epoch"] for a in answers if "producer_epoch" in a]
    if epochs:
        steps = {b - a for a, b in itertools.pairwise(epochs)}
        summary["producer_epochs"] = {
            "first": epochs[0],
            "last": epochs[-1],
            "each_one_more": steps <= {1},
        }
    return summary


class _Received:
    """A client's socket that keeps what it receives (``wire``): the answers' bytes, for
    comparing them byte for byte. (SyncClient reads its socket through ``recv`` alone.)"""

    def __init__(self, sock: socket.socket, wire: bytearray) -> None:
        self.sock = sock
        self.wire = wire

    def recv(self, size: int) -> bytes:
        data = self.sock.recv(size)
        self.wire += data
        return data

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()


class _Connections:
    """One connection per listener, opened when first needed, reopened after a close; what
    their answers' bytes were, in ``wire`` (logging in excluded)."""

    def __init__(self, target: Target, *, login: bool = True) -> None:
        self.target = target
        self.sasl = target.sasl if login else None
        self.clients: dict[str, SyncClient] = {}
        self.wire = bytearray()

    def address(self, listener: str) -> str:
        return self.target.broker if listener == "broker" else self.target.controller

    def connect(self, listener: str) -> SyncClient:
        """A new connection to ``listener``, logged in (if the case logs in): its socket
        then keeps what it receives in :attr:`wire`."""
        client = SyncClient(
            self.address(listener),
            timeout=ANSWER_TIMEOUT_S,
            sasl=self.sasl,
            ssl_context=self.target.tls,
            client_id="pidctl-conformance",
        )
        client._sock = _Received(client._sock, self.wire)  # type: ignore[assignment]
        return client

    def client(self, listener: str) -> SyncClient:
        if listener not in self.clients:
            self.clients[listener] = self.connect(listener)
        return self.clients[listener]

    def drop(self, listener: str) -> None:
        client = self.clients.pop(listener, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        for listener in list(self.clients):
            self.drop(listener)


def _read(client: SyncClient, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = client._sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed by the server")
        data += chunk
    return data


def _raw(connections: _Connections, listener: str, request: Raw) -> Any:
    """Send a :class:`Raw` request on a connection of its own (logged in and over TLS as
    the others); read its answer."""
    client = connections.connect(listener)
    try:
        client._sock.sendall(request.frame(1, "pidctl-conformance"))
        (length,) = struct.unpack(">i", _read(client, 4))
        frame = _read(client, length)
    finally:
        client.close()
    return decode_response(frame, request.api_key, request.answer_version)


def _send(
    connections: _Connections, step: Step, request: Any, client_id: str | None
) -> list[Any] | None:
    """The step's answers, or None when the server closed the connection instead."""
    if isinstance(request, Raw):
        try:
            return [_raw(connections, step.listener, request)]
        except (ConnectionError, EOFError, OSError):
            return None
    client = connections.client(step.listener)
    try:
        if client_id is not None:
            return client.pipeline([request], [client_id])
        if step.repeat == 1:
            return [client.request(request)]
        answers: list[Any] = []
        sent = 0
        while len(answers) < step.repeat:
            while sent < step.repeat and sent - len(answers) < PIPELINE_WINDOW:
                client.send(request)
                sent += 1
            answers.append(client.receive())
        return answers
    except (ConnectionError, EOFError):
        connections.drop(step.listener)
        return None


def _wait_past(answered: float, after_ms: int) -> None:
    """Wait until the wall clock is ``after_ms`` past ``answered`` (a few milliseconds at
    most: what a server's limit of that many milliseconds needs to be passed)."""
    while after_ms and (time.time() - answered) * 1000 < after_ms:
        time.sleep(0.001)


def replay(
    case: Case,
    target: Target,
    *,
    from_source: bool = False,
    seed: int | None = None,
    wire: list[bytes] | None = None,
) -> list[Json]:
    """Replay ``case`` against ``target``; return each step's normalised request and answer.
    With ``from_source`` (Kafka) a step that carries Kafka's answer from its source is not
    sent, and that answer is recorded. With ``seed`` the names the replay makes are that
    seed's, not random (two servers then get the very same requests); ``wire`` gets each
    step's answers as the bytes received (b"" for a connection closed instead)."""
    ctx = Context(target.cluster_id)
    if seed is not None:
        ctx = Context(target.cluster_id, run=f"{seed:08x}", broker_base=1000 + seed * 10)
    normaliser = Normaliser(ctx, target)
    connections = _Connections(target, login=case.login)
    records: list[Json] = []
    answered = time.time()
    try:
        for step in case.steps:
            request = step.build(ctx)
            client_id = step.client_id(ctx) if step.client_id else None
            record: dict[str, Any] = {
                "step": step.name,
                "listener": step.listener,
                "request": normaliser.request(request),
            }
            if client_id is not None:
                record["client_id"] = normaliser.string(client_id)
            if step.repeat > 1:
                record["repeat"] = step.repeat
            if from_source and step.kafka_source is not None:
                record["source"] = step.kafka_source.source
                record["answer"] = dict(step.kafka_source.answer)
                records.append(record)
                continue
            _wait_past(answered, step.after_ms)
            received = len(connections.wire)
            answers = _send(connections, step, request, client_id)
            answered = time.time()
            if wire is not None:
                wire.append(bytes(connections.wire[received:]) if answers is not None else b"")
            if answers is None:
                record["answer"] = {"closed": True}
            else:
                ctx.answers[step.name] = answers[-1]
                normalised = [normaliser.answer(answer) for answer in answers]
                if step.repeat > 1:
                    record["answers"] = summarise(normalised)
                record["answer"] = normalised[-1]
            records.append(record)
    finally:
        connections.close()
    return records
