"""The reservation file: the highest producer id the log's records may grant, on disk
before any record that grants up to it.

A reservation record (:class:`ProducerIdsReserved`) the quorum controller appends asks for a
value (:meth:`ReservationFile.ask`); the log's writer makes a higher one durable before the
commit that holds the record (:meth:`ReservationFile.raise_to_wanted`), so no grant past the
file is ever written, and a lower one after that commit (:meth:`ReservationFile.lower`: a
clean shutdown). The file is replaced atomically through a descriptor opened ahead, so that
no reservation waits for a descriptor it could not have (EMFILE).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

import structlog
import trio

from pidctl.controller.log.datadir import (
    RESERVATION_FILE,
    RESERVATION_NEXT_FILE,
    StorageFailed,
    encode_reservation,
    out_of_descriptors,
    storage_call,
    write_all,
)
from pidctl.controller.log.disk_thread import DiskThread
from pidctl.controller.log.fail_stop import FailStop
from pidctl.controller.log.sync_place import SyncPlace

log: Final = structlog.get_logger("pidctl.metalog")

#: Back-off while no file descriptor can be had for a reservation (commits wait meanwhile).
RESERVATION_RETRY_MIN_S: Final = 0.05


RESERVATION_RETRY_MAX_S: Final = 1.0


class ReservationFile:
    """The reservation file's value on disk (:attr:`reserved`), and the one the records
    appended ask for (:attr:`wanted`)."""

    def __init__(
        self, data_dir: Path, dir_fd: int, reservation: int | None, fail_stop: FailStop
    ) -> None:
        """``dir_fd``: the data dir's, held by the log (directory syncs need no new
        descriptor); ``reservation``: the file's value when the log opens."""
        self.data_dir = data_dir
        self._dir_fd = dir_fd
        self._fail_stop = fail_stop
        self.reserved = reservation
        self.wanted = reservation
        self._spare_fd: int | None = None
        self._open_spare()

    def ask(self, value: int) -> None:
        """A reservation record was appended: the commit that holds it writes ``value``."""
        self.wanted = value

    async def raise_to_wanted(self, disk: DiskThread, sync_place: SyncPlace) -> None:
        """Make the reservation the pending records ask for durable before they are
        written (in the log's thread where ``sync_place`` says commits run). With no file
        descriptor for it (EMFILE, and none opened ahead), the commit waits and tries again.
        Records appended while a reservation is written (in the log's thread) may ask for a
        higher one: it returns only when the file holds what every pending record asks for,
        and the commit takes them with no wait in between."""
        delay = RESERVATION_RETRY_MIN_S
        fail_stop = self._fail_stop
        while True:
            if fail_stop.failed is not None:  # failed meanwhile: the failure ends the writer
                await trio.sleep_forever()
            wanted = self.wanted
            if wanted is None or (self.reserved is not None and wanted <= self.reserved):
                return
            if await self._reserve(wanted, disk, sync_place.in_thread):
                delay = RESERVATION_RETRY_MIN_S
                continue  # (see whether what came meanwhile asks for more)
            if fail_stop.failed is not None:  # not postponed: the log failed meanwhile
                continue
            log.warning("reservation postponed; commits wait", retry_in_s=delay)
            await trio.sleep(delay)
            delay = min(delay * 2, RESERVATION_RETRY_MAX_S)

    def lowered(self) -> bool:
        """Whether the records ask for less than the file holds (everything granted is
        durable: a clean shutdown)."""
        wanted, reserved = self.wanted, self.reserved
        return wanted is not None and reserved is not None and wanted < reserved

    async def lower(self, disk: DiskThread) -> None:
        """After a commit: the lower reservation asked for (:meth:`lowered`) is written, in
        the log's thread."""
        if self.wanted is not None:
            await self._reserve(self.wanted, disk, in_thread=True)

    async def _reserve(self, value: int, disk: DiskThread, in_thread: bool) -> bool:
        """Write ``value`` to the reservation file (see :meth:`_write`); False if
        postponed."""
        try:
            if in_thread:
                done = await disk.call(self._write, value)
            else:
                done = self._write(value)
        except StorageFailed as e:
            if self._fail_stop.first(e):
                raise
            return False  # (the writer stops at its next wait, cancelled by the failure)
        if done:
            self.reserved = value
        return done

    def _write(self, value: int) -> bool:
        """Replace the reservation file atomically through the descriptor opened ahead
        (written, fsynced, renamed over it, the directory fsynced), then open the next one
        ahead. False if there is no descriptor to be had (EMFILE): nothing was changed."""
        if self._spare_fd is None and not self._open_spare():
            return False
        fd, self._spare_fd = self._spare_fd, None
        assert fd is not None
        spare = self.data_dir / RESERVATION_NEXT_FILE
        try:
            write_all(spare, fd, encode_reservation(value), 0)
            storage_call(spare, "fsync", os.fsync, fd)
        finally:
            os.close(fd)
        path = self.data_dir / RESERVATION_FILE
        storage_call(path, "rename", os.replace, spare, path)
        storage_call(self.data_dir, "fsync", os.fsync, self._dir_fd)
        self._open_spare()
        return True

    def _open_spare(self) -> bool:
        """Open (empty) the file the next reservation is written into; False on EMFILE."""
        spare = self.data_dir / RESERVATION_NEXT_FILE
        try:
            self._spare_fd = storage_call(
                spare, "open", os.open, spare, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
            )
        except StorageFailed as e:
            if not out_of_descriptors(e):
                raise
            log.warning("no file descriptor for the next reservation yet", error=e.errno_name)
            return False
        return True

    def close(self) -> None:
        """The log closes: the descriptor opened ahead goes."""
        if self._spare_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._spare_fd)
