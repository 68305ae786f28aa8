"""Start-up over a real data dir: the state recovered and configured, the records every
start writes first made durable; a cluster id that is not the log's, or a log made by
hand, stops it before anything is served."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from pidctl.controller.api.quorum import QuorumController
from pidctl.controller.core.records import ControllerStarted
from pidctl.controller.log.formatting import format_data_dir
from pidctl.controller.log.metalog import MetadataLog
from pidctl.controller.log.recovery import read_log
from pidctl.controller.server.startup import (
    ClusterIdMismatch,
    recover_state,
    write_start_up_records,
)
from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.http import HttpEndpoint
from pidctl.controller.settings import Settings


async def _start(data_dir: Path, settings: Settings) -> None:
    metrics = Metrics()
    state, recovery = await recover_state(data_dir, settings, metrics, HttpEndpoint(metrics, 1))
    recovered = metrics.registry.get_sample_value("pidctl_recovery_duration_seconds")
    assert state.next_offset == 1 and recovered is not None
    quorum: QuorumController
    metalog = MetadataLog(data_dir, state.next_offset, 0, lambda: quorum.snapshot())
    quorum = QuorumController(state, metalog)
    async with trio.open_nursery() as nursery:
        await nursery.start(metalog.run)
        try:
            await write_start_up_records(quorum, metalog, settings, recovery)
            assert metalog.durable_end == state.next_offset  # durable before serving
        finally:
            nursery.cancel_scope.cancel()


async def test_a_start_records_the_controller_started_durably(tmp_path: Path) -> None:
    format_data_dir(tmp_path, "cluster-a", 1, 0)
    await _start(tmp_path, Settings(data_dir=tmp_path, node_id=1))
    records = [e.record for segment in read_log(tmp_path).segments for e in segment.scan.entries]
    assert isinstance(records[1], ControllerStarted)


async def test_another_cluster_id_stops_the_start(tmp_path: Path) -> None:
    format_data_dir(tmp_path, "cluster-a", 1, 0)
    with pytest.RaisesGroup(pytest.RaisesExc(ClusterIdMismatch, match="cluster-b")):
        await _start(tmp_path, Settings(data_dir=tmp_path, cluster_id="cluster-b"))
