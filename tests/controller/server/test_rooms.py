"""The rooms built over a real recovered data dir, as ``pidctl serve`` builds them: a grant
the controller decides reaches the after-commit listener once its commit is durable (the
quorum controller's observers and the log's listener handed in at construction); a data
dir that leased from etcd is refused without pid_source, before anything is opened."""

from __future__ import annotations

import dataclasses
import os
import ssl
from pathlib import Path

import pytest
import trio

from pidctl.controller.core.acl import Authorizer
from pidctl.controller.core.quotas import Quotas
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.formatting import format_data_dir
from pidctl.controller.log.recovery import Recovery
from pidctl.controller.server.rooms import PidSourceMismatch, build_rooms
from pidctl.controller.server.security.sasl import CredentialStore
from pidctl.controller.server.startup import recover_state
from pidctl.controller.server.telemetry.metrics import Metrics
from pidctl.controller.server.transport.connection import now
from pidctl.controller.server.transport.http import HttpEndpoint
from pidctl.controller.settings import Settings


async def _recovered(
    data_dir: Path,
) -> tuple[Settings, Metrics, HttpEndpoint, ControllerState, Recovery]:
    """A freshly formatted data dir recovered as ``pidctl serve`` does: its settings,
    metrics, HTTP endpoint, state and recovery."""
    format_data_dir(data_dir, "cluster-a", 1, 0)
    settings = Settings(data_dir=data_dir)
    metrics = Metrics()
    http = HttpEndpoint(metrics, 1)
    state, recovery = await recover_state(data_dir, settings, metrics, http)
    return settings, metrics, http, state, recovery


async def test_a_grant_is_told_after_its_commit(tmp_path: Path) -> None:
    settings, metrics, http, state, recovery = await _recovered(tmp_path)
    store = CredentialStore()
    rooms = build_rooms(
        settings, state, recovery, metrics, http, Quotas({}), Authorizer(), lambda: store
    )
    assert rooms.lease_keeper is None  # no pid_source
    async with trio.open_nursery() as nursery:
        await nursery.start(rooms.metalog.run)
        manager = state.producer_ids
        _, offset = rooms.quorum.apply(
            manager.allocate_for_job(principal="User:a", client_id=None), now()
        )
        granted = "pidctl_producer_id_blocks_granted_total"
        labels = {"holder": "job", "broker": "-1"}
        assert metrics.registry.get_sample_value(granted, labels) is None  # not durable yet
        await rooms.metalog.wait_durable(offset)
        assert metrics.registry.get_sample_value(granted, labels) == 1
        # The state's gauges, registered by the rooms, read the state itself.
        gauge = metrics.registry.get_sample_value
        assert gauge("pidctl_next_producer_id") == state.producer_ids.next_producer_id == 1000
        assert gauge("pidctl_registered_brokers") == gauge("pidctl_fenced_brokers") == 0
        nursery.cancel_scope.cancel()


async def test_a_data_dir_that_leased_is_refused_without_pid_source(tmp_path: Path) -> None:
    settings, metrics, http, state, recovery = await _recovered(tmp_path)
    state.leases.lease_mode = True  # (as a lease record leaves it)
    store = CredentialStore()
    open_before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(PidSourceMismatch):
        build_rooms(
            settings, state, recovery, metrics, http, Quotas({}), Authorizer(), lambda: store
        )
    # Refused before the log is opened: no descriptor is left behind (the server exits).
    assert sorted(os.listdir("/proc/self/fd")) == open_before


async def test_an_etcd_ca_that_cannot_be_read_is_refused_before_the_log_is_opened(
    tmp_path: Path,
) -> None:
    """What can fail in building the rooms fails before the log opens its files: an etcd
    CA file that is no PEM (settings only check that it is a file)."""
    settings, metrics, http, state, recovery = await _recovered(tmp_path / "data")
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate\n")
    settings = dataclasses.replace(
        settings, pid_source="etcds://127.0.0.1:1/pidctl", etcd_cafile=str(not_pem)
    )
    store = CredentialStore()
    open_before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(ssl.SSLError):
        build_rooms(
            settings, state, recovery, metrics, http, Quotas({}), Authorizer(), lambda: store
        )
    assert sorted(os.listdir("/proc/self/fd")) == open_before
