"""The benchmark tools work (not how fast: figures live in ops/bench, never in tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from ops.bench import faults, loadgen
from ops.bench.suite import chart
from ops.testing.serverproc import ServerProcess


@pytest.mark.parametrize("scenario", loadgen.SCENARIOS)
def test_load_generator_scenarios(server: ServerProcess, scenario: str) -> None:
    result = trio.run(loadgen.run, server.bootstrap, scenario, 2, 2, 0.3)
    assert result["requests"] > 0 and result["p50_ms"] <= result["p99_ms"]


def test_load_generator_fails_on_an_unexpected_error(server: ServerProcess) -> None:
    # Broker ids registered by another run: a new incarnation is refused.
    trio.run(loadgen.run, server.bootstrap, "allocate", 1, 1, 0.1)
    with pytest.raises(RuntimeError, match="registration refused"):
        trio.run(loadgen.run, server.bootstrap, "allocate", 1, 1, 0.1)


def test_storm(server: ServerProcess) -> None:
    result = trio.run(loadgen.storm, server.bootstrap, 200, 0.2, 30.0)
    assert result["served"] == 200 and result["last_served_s"] < 30


def test_chart(tmp_path: Path) -> None:
    rows = [
        {"group": "ceiling", "name": "x", "per_second": 10.0},
        {"group": "grants", "name": "y", "per_second": 5.0},
    ]
    chart(rows, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_small_fault_campaign_finds_nothing_lost(capsys: pytest.CaptureFixture[str]) -> None:
    assert faults.main(["--kills", "4", "--faults", "3", "--episode", "7", "--seed", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["kills"] == 4 and result["grants_checked"] >= result["grants_acknowledged"] > 0
    # A fault not reached in time is tried again (at most as often as faults were asked for).
    assert result["faults_injected"] >= 1
    assert result["faults_injected"] + result["faults_not_reached"] >= 3
