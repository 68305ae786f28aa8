"""A metadata log's buffer without the disk, for tests of the rooms that append to it."""

from __future__ import annotations


class MemoryLog:
    """The log's buffer without the disk: entries in order."""

    def __init__(self) -> None:
        self.entries: list[bytes] = []

    def append_entry(self, entry: bytes) -> int:
        self.entries.append(entry)
        return len(self.entries) - 1
