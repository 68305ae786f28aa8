"""The standalone Spark harness opens only ports it chose: two masters side by side both
lead, each on its own RPC, web UI and REST ports (another standalone master on the machine,
on Spark's defaults or not, is never touched)."""

from __future__ import annotations

import re
import socket

import pytest

from ops.testing.spark_cluster import SparkCluster, live_processes

pytestmark = pytest.mark.slow


def test_two_masters_side_by_side_each_on_its_own_ports() -> None:
    with SparkCluster(worker=False) as first, SparkCluster(worker=False) as second:
        for master in (first, second):
            assert master.status()["status"] == "ALIVE"  # not STANDBY behind the other
            log = master.log("master.log").read_text(errors="replace")
            rest = re.search(r"Started REST server for submitting applications .* port (\d+)", log)
            assert rest is not None and int(rest.group(1)) == master.rest_port, log[-2000:]
        ports = {(m.port, m.webui_port, m.rest_port) for m in (first, second)}
        assert len(ports) == 2
        groups = first.process_groups() + second.process_groups()
    assert live_processes(groups) == []


@pytest.mark.parametrize("taken", ["port", "webui_port", "rest_port"])
def test_a_port_taken_before_the_master_binds_starts_it_on_new_ports(taken: str) -> None:
    """Another process took one of the master's ports between its choice and the start (CI
    saw a connection take it): the master starts on newly chosen ports and leads."""
    cluster = SparkCluster(worker=False)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", getattr(cluster, taken)))
        squatter.listen()
        with cluster:
            assert cluster.status()["status"] == "ALIVE"
            assert getattr(cluster, taken) != squatter.getsockname()[1]
