"""The free-space watch: below data_dir_min_free_bytes the controller's grants pause and
/readyz fails; with room again they resume. Over the real filesystem of a temporary dir."""

from __future__ import annotations

import shutil
from pathlib import Path

import trio

from pidctl.controller.api.handlers import Controller
from pidctl.controller.api.pool_grants import for_pool
from pidctl.controller.api.quorum import QuorumController
from pidctl.controller.core.state import ControllerState
from pidctl.controller.server.free_space import FreeSpaceWatch
from pidctl.controller.server.telemetry.alarms import Alarm
from pidctl.controller.server.telemetry.metrics import Metrics
from tests.controller.memory_log import MemoryLog


def _controller() -> Controller:
    state = ControllerState()
    pool_grants = for_pool(state)
    return Controller(
        QuorumController(state, MemoryLog(), (pool_grants.applied,)), pool_grants=pool_grants
    )


async def test_grants_pause_below_the_minimum_and_resume_with_room(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    for minimum, paused in ((free * 2, True), (0, False)):
        metrics, faults = Metrics(), dict[str, str]()
        controller = _controller()
        watch = FreeSpaceWatch(
            tmp_path, minimum, controller, metrics, Alarm("disk_space", "x", faults)
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(watch.run)  # started once the first look is taken
            nursery.cancel_scope.cancel()
        assert (controller.paused is not None) == paused == ("disk_space" in faults)
        assert metrics.registry.get_sample_value("pidctl_grants_paused") == (1 if paused else 0)
        assert (metrics.registry.get_sample_value("pidctl_data_dir_free_bytes") or 0) > 0
