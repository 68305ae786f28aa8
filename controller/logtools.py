"""``pidctl log dump`` and ``pidctl log verify``: read-only views of a data dir."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .logformat import LogEntry
from .metalog import LogContents, LogCorruption, read_log, rebuild_state
from .records import record_to_dict


def entry_to_dict(entry: LogEntry) -> dict[str, Any]:
    """One record as the JSON object ``pidctl log dump --json`` prints."""
    return {
        "offset": entry.offset,
        "timestamp_ms": entry.timestamp_ms,
        "time": _iso(entry.timestamp_ms),
        **record_to_dict(entry.record),
    }


def _iso(timestamp_ms: int) -> str:
    moment = datetime.datetime.fromtimestamp(timestamp_ms / 1000, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def dump_lines(data_dir: Path, as_json: bool) -> Iterator[str]:
    """Every record kept in the data dir, oldest first, as text or JSON lines."""
    contents = read_log(data_dir)
    if not as_json and contents.snapshot_path is not None:
        state = contents.snapshot_state or {}
        yield (
            f"# snapshot at offset {contents.snapshot_offset}: "
            f"next_producer_id={state.get('next_producer_id')} "
            f"brokers={len(state.get('brokers', []))}"
        )
    for entry in contents.entries():
        item = entry_to_dict(entry)
        if as_json:
            yield json.dumps(item, separators=(",", ":"))
        else:
            fields = " ".join(
                f"{k}={v}"
                for k, v in item.items()
                if k not in ("offset", "timestamp_ms", "time") and k != "type" and v is not None
            )
            yield f"{item['offset']:>10}  {item['time']}  {item['type']:<20} {fields}"
    if contents.torn_tail_bytes:
        yield f"# torn tail: {contents.torn_tail_bytes} bytes ({contents.torn_tail_problem})"


@dataclass(frozen=True, slots=True)
class VerifyReport:
    ok: bool
    lines: list[str]


def verify(data_dir: Path) -> VerifyReport:
    """Check checksums, offsets and every replay invariant, changing nothing."""
    if not data_dir.is_dir():
        return VerifyReport(False, [f"{data_dir}: no such data dir"])
    try:
        contents: LogContents = read_log(data_dir)
        state, replayed = rebuild_state(contents)
    except LogCorruption as e:
        return VerifyReport(False, [f"CORRUPT: {e}"])
    lines = [
        f"segments: {len(contents.segments)}, records: {len(contents.entries())}, "
        f"snapshot offset: {contents.snapshot_offset}, replayed: {replayed}",
        f"cluster id: {state.cluster_id}, next offset: {state.next_offset}, "
        f"next producer id: {state.next_producer_id}, brokers: {len(state.brokers)}",
    ]
    if contents.torn_tail_bytes:
        lines.append(
            f"warning: torn tail of {contents.torn_tail_bytes} bytes in "
            f"{contents.segments[-1].path.name} (a write cut short by a crash; start-up "
            "truncates it)"
        )
    lines.append("OK")
    return VerifyReport(True, lines)
