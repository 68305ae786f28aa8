"""``pidctl log dump`` and ``pidctl log verify``: read-only views of a data dir."""

from __future__ import annotations

import datetime
import json
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from pidctl.controller.core.logformat import LogCorruption, LogEntry, iso_time
from pidctl.controller.core.logformat import entry_to_dict as entry_to_dict
from pidctl.controller.core.records import (
    BrokerRegistered,
    BrokerUnregistered,
    ControllerStarted,
    ProducerIdFloorRaised,
    ProducerIdsGranted,
    ProducerIdsLeased,
)
from pidctl.controller.log.datadir import check_reservation
from pidctl.controller.log.recovery import LogContents, read_log, rebuild_state, snapshot_state

Progress = Callable[[int, int], None]  # (bytes read, bytes in all)


def parse_time(text: str) -> int:
    """``--since``/``--until``: ISO 8601 (UTC unless it says otherwise) or epoch milliseconds."""
    if text.isdigit():
        return int(text)
    moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class DumpFilter:
    """Which records to show: those about one broker, and/or within a time range."""

    broker_id: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    def __call__(self, entry: LogEntry) -> bool:
        if self.since_ms is not None and entry.timestamp_ms < self.since_ms:
            return False
        if self.until_ms is not None and entry.timestamp_ms > self.until_ms:
            return False
        if self.broker_id is not None:
            record = entry.record
            if isinstance(record, ProducerIdsGranted) and record.holder != "broker":
                return False  # the controller's own blocks carry its node id, not a broker's
            return getattr(record, "broker_id", None) == self.broker_id
        return True


def selected(
    data_dir: Path, keep: DumpFilter, progress: Progress | None = None
) -> tuple[LogContents, list[LogEntry]]:
    contents = read_log(data_dir, progress)
    return contents, [e for e in contents.entries() if keep(e)]


def dump_lines(
    data_dir: Path,
    as_json: bool,
    keep: DumpFilter | None = None,
    progress: Progress | None = None,
) -> Iterator[str]:
    """Every (selected) record kept in the data dir, oldest first, as text or JSON lines."""
    contents, entries = selected(data_dir, keep or DumpFilter(), progress)
    return format_dump(contents, entries, as_json)


def format_dump(contents: LogContents, entries: list[LogEntry], as_json: bool) -> Iterator[str]:
    """:func:`dump_lines` of records already read: text lines say what the snapshot holds,
    that records before an offset were removed, and a damaged tail; JSON lines are only the
    records."""
    removed = removed_before(contents)
    state = snapshot_state(contents)
    if not as_json and state is not None:
        yield (
            f"# snapshot at offset {contents.snapshot_offset}: "
            f"next_producer_id={state.next_producer_id} brokers={len(state.cluster.brokers)}"
        )
    if not as_json and removed:
        yield f"# {removed_note(removed)}"
    for entry in entries:
        item = entry_to_dict(entry)
        if as_json:
            yield json.dumps(item, separators=(",", ":"))
        else:
            skip = ("offset", "timestamp_ms", "time", "type")
            fields = " ".join(
                f"{k}={shown(v)}" for k, v in item.items() if k not in skip and v is not None
            )
            yield f"{item['offset']:>10}  {item['time']}  {item['type']:<22} {fields}"
    if contents.torn_tail_bytes:
        yield (
            f"# damaged tail: {contents.torn_tail_bytes} bytes that are not a record "
            f"({contents.torn_tail_problem}): a write cut short by a crash, or damage to "
            "acknowledged records (see `pidctl log verify`)"
        )


#: What a value may hold and be shown as it is: anything else is quoted (logfmt's way).
_QUOTED: Final = frozenset(' "=,\\')


def shown(value: object) -> str:
    """A value as a text line of ``pidctl log dump`` shows it: as it is when it is plain;
    else in double quotes, with ``\\`` and ``"`` escaped and every character that is not
    printable (a control character, an escape sequence's ESC, a line or paragraph
    separator, a bidirectional override) as a ``\\x``, ``\\u`` or ``\\U`` escape. A client
    chooses its client id (and a job its app id): none can make a line of the audit trail,
    a field, or a terminal escape of its own, and the escapes read back to what the log
    holds (``--json`` prints it as JSON strings)."""
    if isinstance(value, tuple | list):  # (a broker's listeners)
        return ",".join(shown(item) for item in value)
    text = str(value)
    if text and text.isprintable() and _QUOTED.isdisjoint(text):
        return text
    return '"' + "".join(_escaped(char) for char in text) + '"'


def _escaped(char: str) -> str:
    if char in '"\\':
        return "\\" + char
    if char.isprintable():
        return char
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def removed_before(contents: LogContents) -> int:
    """The offset before which records were removed (covered by a snapshot, and past the
    audit trail's retention); 0 if the log still holds every record from the first."""
    if contents.segments:
        return contents.segments[0].base_offset
    return contents.snapshot_offset


def removed_note(offset: int) -> str:
    """What ``pidctl log dump`` and ``verify`` say when records before ``offset`` are gone."""
    return (
        f"records before offset {offset} were removed: a snapshot covers them and they were "
        "older than log_retention_ms and past log_retention_bytes (the snapshot keeps their "
        "effect, not the records)"
    )


@dataclass
class _Holder:
    blocks: int = 0
    pids: int = 0
    first: int | None = None
    last: int = -1
    epochs: set[int] = field(default_factory=set)


def summary_lines(entries: list[LogEntry]) -> list[str]:
    """The audit summary: blocks and PIDs per holder, holes in the granted range, and what
    restarts abandoned (the blocks a restarted controller or re-registered broker held)."""
    holders: dict[tuple[str, str], _Holder] = defaultdict(_Holder)
    holes: list[tuple[int, int]] = []
    previous_end: int | None = None
    restarts = 0
    controller_blocks_since_start = 0
    abandoned_controller_blocks = 0
    reregistrations: list[str] = []
    epochs: dict[int, int] = {}
    leases: list[tuple[int, int]] = []
    floors: list[str] = []
    for entry in entries:
        record = entry.record
        if isinstance(record, ProducerIdsLeased):
            leases.append((record.first_producer_id, record.next_producer_id))
        elif isinstance(record, ProducerIdFloorRaised):
            floors.append(
                f"  raised to {record.next_producer_id} at "
                f"{iso_time(entry.timestamp_ms)} by {record.origin}"
            )
        elif isinstance(record, ProducerIdsGranted):
            # A job is known by its client id (a Spark application id), not a broker id.
            who = (
                shown(record.client_id or "?") if record.holder == "job" else str(record.broker_id)
            )
            holder = holders[(record.holder, who)]
            holder.blocks += 1
            holder.pids += record.next_producer_id - record.first_producer_id
            holder.first = record.first_producer_id if holder.first is None else holder.first
            holder.last = record.next_producer_id - 1
            if record.broker_epoch >= 0:
                holder.epochs.add(record.broker_epoch)
            if previous_end is not None and record.first_producer_id > previous_end:
                holes.append((previous_end, record.first_producer_id))
            previous_end = record.next_producer_id
            if record.holder == "controller":
                controller_blocks_since_start += 1
        elif isinstance(record, ControllerStarted):
            if restarts:
                # The pool keeps the current and at most one prefetched block.
                abandoned_controller_blocks += min(controller_blocks_since_start, 2)
            restarts += 1
            controller_blocks_since_start = 0
        elif isinstance(record, BrokerRegistered):
            old = epochs.get(record.broker_id)
            if old is not None:
                reregistrations.append(
                    f"broker {record.broker_id}: epoch {old} -> {record.broker_epoch} at "
                    f"{iso_time(entry.timestamp_ms)} (its unused PIDs of epoch {old} are lost)"
                )
            epochs[record.broker_id] = record.broker_epoch
        elif isinstance(record, BrokerUnregistered):
            epochs.pop(record.broker_id, None)
    total_blocks = sum(h.blocks for h in holders.values())
    total_pids = sum(h.pids for h in holders.values())
    lines = [f"blocks granted: {total_blocks} ({total_pids} producer ids)"]
    # Numeric ids in numeric order: shorter first, then by text.
    for (kind, holder_id), h in sorted(
        holders.items(), key=lambda i: (i[0][0], len(i[0][1]), i[0][1])
    ):
        epoch_text = f", epochs {sorted(h.epochs)}" if h.epochs else ""
        lines.append(
            f"  {kind} {holder_id}: {h.blocks} blocks, {h.pids} producer ids, "
            f"{h.first}..{h.last}{epoch_text}"
        )
    lines.append(f"controller starts: {restarts}")
    if abandoned_controller_blocks:
        lines.append(
            f"  blocks of the controller's own pool abandoned by restarts: at most "
            f"{abandoned_controller_blocks} (their unused producer ids are never handed out)"
        )
    if leases:
        leased = sum(end - first for first, end in leases)
        lines.append(f"leases from etcd: {len(leases)} ({leased} producer ids)")
    if floors:
        lines.append("high-water mark imports:")
        lines.extend(floors)
    lines.append(f"holes in the granted range: {len(holes)}")
    lines.extend(
        f"  {start}..{end - 1} never granted{_lease_note(start, end, leases)}"
        for start, end in holes
    )
    if reregistrations:
        lines.append("broker re-registrations:")
        lines.extend(f"  {line}" for line in reregistrations)
    return lines


def _lease_note(start: int, end: int, leases: list[tuple[int, int]]) -> str:
    """With leases, a hole is mostly other controllers' ranges; say how much of it was ours."""
    if not leases:
        return ""
    ours = sum(max(0, min(end, e) - max(start, f)) for f, e in leases)
    if ours == 0:
        return " (not leased here: other controllers' ranges)"
    return f" ({ours} of them leased here and left unused)"


@dataclass(frozen=True, slots=True)
class VerifyReport:
    ok: bool
    lines: list[str]


def verify(data_dir: Path, progress: Progress | None = None) -> VerifyReport:
    """Check checksums, offsets and every replay invariant, changing nothing."""
    if not data_dir.is_dir():
        return VerifyReport(False, [f"{data_dir}: no such data dir"])
    try:
        contents = read_log(data_dir, progress)
        state, replayed = rebuild_state(contents)
        check_reservation(data_dir, contents.reservation, state)
    except LogCorruption as e:
        return VerifyReport(False, [f"CORRUPT: {e}"])
    resume_at = state.producer_ids.resume(contents.reservation).response
    reservation = (
        f"up to {contents.reservation}"
        if contents.reservation is not None
        else "none (a log from before reservations, or nothing granted yet)"
    )
    lines = [
        f"segments: {len(contents.segments)}, records: {len(contents.entries())}, "
        f"snapshot offset: {contents.snapshot_offset}, replayed: {replayed}",
        f"cluster id: {state.cluster_id}, next offset: {state.next_offset}, "
        f"next producer id: {state.next_producer_id}, brokers: {len(state.cluster.brokers)}, "
        f"transactional ids: {len(state.transactions.transactional_ids)}",
        f"reservation: {reservation}; a start-up now grants from {resume_at}",
    ]
    removed = removed_before(contents)
    if removed:
        lines.append(removed_note(removed))
    if contents.torn_tail_bytes:
        torn = next(s for s in contents.segments if s.scan.problem is not None)
        lines.append(
            f"DAMAGED TAIL: the last {contents.torn_tail_bytes} bytes of {torn.path.name} are "
            f"not a record ({contents.torn_tail_problem}). A write cut short by a crash "
            "leaves this (never acknowledged), and so does damage to records already synced "
            "and acknowledged (a flipped bit, a truncation): the two cannot be told apart. "
            f"Start-up truncates them and grants from {resume_at} on, above anything they "
            "could have held."
        )
        return VerifyReport(False, lines)
    lines.append("OK")
    return VerifyReport(True, lines)
