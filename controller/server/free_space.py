"""The data dir's free space, watched while serving: below ``data_dir_min_free_bytes``
grants pause before a commit meets ENOSPC (which stops the server)."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import trio

from pidctl.controller.api.handlers import Controller
from pidctl.controller.log.space import SpaceVerdict, free_bytes
from pidctl.controller.server.telemetry.alarms import Alarm
from pidctl.controller.server.telemetry.metrics import Metrics

#: How often the data dir's free space is looked at while serving (one statvfs, in a
#: worker thread): below data_dir_min_free_bytes grants pause within this long.
FREE_SPACE_CHECK_S: Final = 1.0


class FreeSpaceWatch:
    """Pauses the controller's grants while the data dir is nearly full."""

    def __init__(
        self,
        data_dir: Path,
        minimum: int,
        controller: Controller,
        metrics: Metrics,
        low_space: Alarm,
    ) -> None:
        self.data_dir = data_dir
        self.minimum = minimum
        self.controller = controller
        self.metrics = metrics
        self._low_space = low_space

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The data dir's free space, every ``FREE_SPACE_CHECK_S``: a gauge, and below
        ``data_dir_min_free_bytes`` grants pause (``Controller.paused``: retriable errors,
        nothing written), ``/readyz`` fails, and the log says why, before a commit meets
        ENOSPC (which stops the server); they resume once there is room again. Started
        once the first look is taken."""
        data_dir, minimum = self.data_dir, self.minimum
        while True:
            free = await trio.to_thread.run_sync(free_bytes, data_dir)
            self.metrics.data_dir_free_bytes.set(free)
            problem = SpaceVerdict(free, minimum).problem
            if problem is None:
                self._low_space.clear(free_bytes=free, grants="resumed")
            else:
                self._low_space.sound(
                    problem,
                    data_dir=str(data_dir),
                    free_bytes=free,
                    grants="paused: InitProducerId answered COORDINATOR_LOAD_IN_PROGRESS, "
                    "AllocateProducerIds KAFKA_STORAGE_ERROR, until there is room",
                )
            self.controller.paused = problem
            self.metrics.grants_paused.set(0 if problem is None else 1)
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
            await trio.sleep(FREE_SPACE_CHECK_S)
