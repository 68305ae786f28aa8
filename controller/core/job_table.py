"""The app ids' latest versions, packed, in shards copied on write: a snapshot takes the
table in a few microseconds whatever it holds, and never copies it on the event loop.

An app id's row is one bytes object (``_HEAD`` then a ``<q`` per block: the blocks' first
PIDs in block order), immutable like the transactional ids' rows (``transactions.py``). The
rows live in :data:`SHARDS` dicts, an app id's shard fixed by a CRC-32 of its UTF-8 bytes.
:meth:`JobTable.copy` (a snapshot) shares every shard with the copy and marks them shared;
a change to a shared shard copies that shard first (a thousandth of the table), so each
shard is copied at most once per snapshot, by the first request that changes it.

Within a shard the app ids are in the order their latest version was recorded (a new
version moves its app id to the end, a block more keeps its place), which is the order of
their running stamps (``job_clock.py``): an expiry reads each shard from the front and
stops at the first app id still in use.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import Final

#: Shards of the table: with a million app ids, a thousand rows a shard, copied in about
#: 20 us by the first change after a snapshot; a snapshot's copy of the shard list and an
#: expiry's look at every shard's front stay near 10 us and 200 us. A power of two.
SHARDS: Final = 1024
#: A row's head: version, allocated ms (job time), running ms, owner (an index into the
#: table's owners; 0: none, a version recorded before app ids had owners).
_HEAD: Final = struct.Struct("<qqqI")
_BLOCK: Final = struct.Struct("<q")
#: Where a row keeps its running ms, read without unpacking the rest.
_RUNNING: Final = struct.Struct("<q")
_RUNNING_AT: Final = 16
#: Where a row keeps its owner index, read or replaced without unpacking the rest.
_OWNER: Final = struct.Struct("<I")
_OWNER_AT: Final = 24
#: In :meth:`JobTable.packed_chunks`: a key's or a row's length (a row holds at most 1000 blocks).
_LENGTH: Final = struct.Struct("<H")
#: The owner index of "no owner".
NO_OWNER: Final = 0


def shard_of(app_id: str) -> int:
    """The app id's shard: the same in every process (a snapshot keeps each shard's order)."""
    return zlib.crc32(app_id.encode("utf-8", "surrogatepass")) & (SHARDS - 1)


class AppVersion:
    """An app id's latest version, read from its row: version, ``allocated_ms`` (job time of
    its first block), ``running_ms`` (running time then), owner (None: recorded before app
    ids had owners), and its blocks' first PIDs (:meth:`block`)."""

    __slots__ = ("_row", "allocated_ms", "owner", "running_ms", "version")

    def __init__(self, row: bytes, owner: str | None) -> None:
        version, allocated_ms, running_ms, _ = _HEAD.unpack_from(row)
        self.version: Final[int] = version
        self.allocated_ms: Final[int] = allocated_ms
        self.running_ms: Final[int] = running_ms
        self.owner: Final[str | None] = owner
        self._row = row

    @property
    def block_count(self) -> int:
        return (len(self._row) - _HEAD.size) // _BLOCK.size

    def block(self, index: int) -> int:
        """The first PID of block ``index`` (below :attr:`block_count`)."""
        return int(_BLOCK.unpack_from(self._row, _HEAD.size + index * _BLOCK.size)[0])

    @property
    def blocks(self) -> list[int]:
        return [self.block(index) for index in range(self.block_count)]


class JobTable:
    """app id → its latest version (:class:`AppVersion`), and how many app ids each owner
    holds."""

    __slots__ = ("_held", "_owner_index", "_shards", "_shared", "owners")

    def __init__(self) -> None:
        self._shards: list[dict[str, bytes]] = [{} for _ in range(SHARDS)]
        #: Per shard: 1 while a copy holds it too (it is copied before it changes).
        self._shared = bytearray(SHARDS)
        #: Owners by index (append-only; index 0 is "no owner").
        self.owners: list[str] = [""]
        self._owner_index: dict[str, int] = {}
        #: App ids held per owner index.
        self._held: dict[int, int] = {}

    # -- reading ----------------------------------------------------------------------------

    def get(self, app_id: str) -> AppVersion | None:
        row = self._shards[shard_of(app_id)].get(app_id)
        if row is None:
            return None
        owner = _HEAD.unpack_from(row)[3]
        return AppVersion(row, self.owners[owner] if owner else None)

    def held_by(self, owner: str) -> int:
        """How many app ids ``owner`` holds."""
        index = self._owner_index.get(owner)
        return 0 if index is None else self._held.get(index, 0)

    def __len__(self) -> int:
        return sum(len(shard) for shard in self._shards)

    def __contains__(self, app_id: object) -> bool:
        return isinstance(app_id, str) and app_id in self._shards[shard_of(app_id)]

    def __iter__(self) -> Iterator[str]:
        for shard in self._shards:
            yield from shard

    def items(self) -> Iterator[tuple[str, AppVersion]]:
        for shard in self._shards:
            for app_id in shard:
                version = self.get(app_id)
                assert version is not None
                yield app_id, version

    def expired(self, before_running_ms: int, limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` app ids whose latest version's running stamp is below
        ``before_running_ms``, with their versions: each shard read from its front, up to
        its first app id stamped since. Costs what expires, and a look at each shard."""
        found: list[tuple[str, int]] = []
        running, version = _RUNNING.unpack_from, _BLOCK.unpack_from
        for shard in self._shards:
            for app_id, row in shard.items():
                if len(found) >= limit or running(row, _RUNNING_AT)[0] >= before_running_ms:
                    break
                found.append((app_id, version(row)[0]))
            if len(found) >= limit:
                break
        return found

    # -- changes ----------------------------------------------------------------------------

    def put_version(
        self,
        app_id: str,
        version: int,
        allocated_ms: int,
        running_ms: int,
        owner: str | None,
        first_block: int,
    ) -> None:
        """A new latest version of ``app_id``, holding its block 0: to the end of its shard."""
        index = self._owner(owner)
        row = _HEAD.pack(version, allocated_ms, running_ms, index) + _BLOCK.pack(first_block)
        shard = self._writable(shard_of(app_id))
        old = shard.pop(app_id, None)
        if old is not None:
            self._count(_HEAD.unpack_from(old)[3], -1)
        shard[app_id] = row
        self._count(index, 1)

    def add_block(self, app_id: str, first_block: int) -> None:
        """One block more for ``app_id``'s latest version (its place stays)."""
        shard = self._writable(shard_of(app_id))
        shard[app_id] += _BLOCK.pack(first_block)

    def remove(self, app_id: str) -> None:
        shard = self._writable(shard_of(app_id))
        row = shard.pop(app_id)
        self._count(_HEAD.unpack_from(row)[3], -1)

    def _writable(self, index: int) -> dict[str, bytes]:
        shard = self._shards[index]
        if self._shared[index]:
            shard = dict(shard)
            self._shards[index] = shard
            self._shared[index] = 0
        return shard

    def _owner(self, owner: str | None) -> int:
        if owner is None:
            return NO_OWNER
        index = self._owner_index.get(owner)
        if index is None:
            index = len(self.owners)
            self.owners.append(owner)
            self._owner_index[owner] = index
        return index

    def _count(self, index: int, change: int) -> None:
        if index != NO_OWNER:
            self._held[index] = self._held.get(index, 0) + change

    # -- snapshots --------------------------------------------------------------------------

    def copy(self) -> JobTable:
        """A copy later changes do not reach, in time proportional to :data:`SHARDS`: both
        share every shard until one of them changes it."""
        copied = JobTable.__new__(JobTable)
        copied._shards = list(self._shards)
        self._shared = bytearray(b"\x01" * SHARDS)
        copied._shared = bytearray(b"\x01" * SHARDS)
        copied.owners = list(self.owners)
        copied._owner_index = dict(self._owner_index)
        copied._held = dict(self._held)
        return copied

    def packed_chunks(self, most_bytes: int) -> Iterator[tuple[int, tuple[str, ...], bytearray]]:
        """Every app id and its row in chunks of about ``most_bytes`` (a row never split),
        shard by shard, each in its order: per app id a u16 (little-endian) length, the id
        in UTF-8, a u16 length, the row. Each chunk with how many app ids it holds and the
        owners its rows name (their indices into that tuple; 0: no owner)."""
        out = bytearray()
        count = 0
        local: dict[int, int] = {NO_OWNER: NO_OWNER}
        owners: list[str] = [""]
        length, head = _LENGTH.pack, _HEAD.size
        for shard in self._shards:
            for app_id, row in shard.items():
                key = app_id.encode("utf-8", "surrogatepass")
                if out and len(out) + 2 * _LENGTH.size + len(key) + len(row) > most_bytes:
                    yield count, tuple(owners), out
                    out, count = bytearray(), 0
                    local, owners = {NO_OWNER: NO_OWNER}, [""]
                owner = _OWNER.unpack_from(row, _OWNER_AT)[0]
                index = local.get(owner)
                if index is None:
                    index = local[owner] = len(owners)
                    owners.append(self.owners[owner])
                out += length(len(key))
                out += key
                out += length(len(row))
                out += row[:_OWNER_AT]
                out += _OWNER.pack(index)
                out += row[head:]
                count += 1
        if out:
            yield count, tuple(owners), out

    def load_packed(
        self, data: bytes | bytearray | memoryview, count: int, owners: tuple[str, ...]
    ) -> None:
        """Append the ``count`` app ids (none held yet) of a chunk :meth:`packed_chunks`
        wrote, whose rows name ``owners``; ValueError if it does not hold that (what was
        appended before the fault stays: replay stops the start-up then)."""
        if not owners or owners[0] != "":
            raise ValueError("packed job allocations: owners must start with the empty owner")
        mine = [NO_OWNER] + [self._owner(owner) for owner in owners[1:]]
        view = memoryview(data)
        size, position, read_length = len(view), 0, _LENGTH.unpack_from
        rows = 0
        unsorted: set[int] = set()
        while position < size:
            if size - position < _LENGTH.size:
                raise ValueError(f"packed job allocations: truncated at byte {position}")
            key_start = position + _LENGTH.size
            key_end = key_start + read_length(view, position)[0]
            if key_end + _LENGTH.size > size:
                raise ValueError(f"packed job allocations: truncated at byte {key_start}")
            row_start = key_end + _LENGTH.size
            position = row_start + read_length(view, key_end)[0]
            row = bytes(view[row_start:position])
            if position > size or len(row) < _HEAD.size + _BLOCK.size:
                raise ValueError(f"packed job allocations: a bad row at byte {row_start}")
            owner = _OWNER.unpack_from(row, _OWNER_AT)[0]
            if (len(row) - _HEAD.size) % _BLOCK.size or owner >= len(owners):
                raise ValueError(f"packed job allocations: a bad row at byte {row_start}")
            if mine[owner] != owner:
                row = row[:_OWNER_AT] + _OWNER.pack(mine[owner]) + row[_HEAD.size :]
            app_id = str(view[key_start:key_end], "utf-8", "surrogatepass")
            if not self._load(app_id, row):
                unsorted.add(shard_of(app_id))
            rows += 1
        for index in unsorted:
            self._sort(index)
        if rows != count:
            raise ValueError(f"packed job allocations: {rows} app ids, expected {count}")

    def _load(self, app_id: str, row: bytes) -> bool:
        """Append a row read back to its shard; whether the shard is still in the order of
        running stamps (as a snapshot writes each shard; one written with other shards may
        not be: :meth:`_sort` it then)."""
        shard = self._writable(shard_of(app_id))
        if app_id in shard:
            raise ValueError(f"app id {app_id!r} twice")
        in_order = not shard or _running(next(reversed(shard.values()))) <= _running(row)
        shard[app_id] = row
        self._count(_OWNER.unpack_from(row, _OWNER_AT)[0], 1)
        return in_order

    def _sort(self, index: int) -> None:
        shard = self._shards[index]
        self._shards[index] = dict(sorted(shard.items(), key=lambda item: _running(item[1])))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobTable) or len(self) != len(other):
            return False
        return all(_same(mine, other.get(app_id)) for app_id, mine in self.items())

    __hash__ = None  # type: ignore[assignment]


def _same(mine: AppVersion, theirs: AppVersion | None) -> bool:
    return theirs is not None and (
        mine.version,
        mine.allocated_ms,
        mine.running_ms,
        mine.owner,
        mine.blocks,
    ) == (theirs.version, theirs.allocated_ms, theirs.running_ms, theirs.owner, theirs.blocks)


def _running(row: bytes) -> int:
    """A row's running stamp."""
    return int(_RUNNING.unpack_from(row, _RUNNING_AT)[0])
