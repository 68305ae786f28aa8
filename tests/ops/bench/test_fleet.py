"""The fleet rows run a real etcd and real controllers, and say what each side's CPU did
(how fast is for ops/bench, never for tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.bench import suite


@pytest.mark.slow
def test_the_fleet_rows_report_their_controllers_and_clients_cpu(tmp_path: Path) -> None:
    suite.main(["--short", "--only", "fleet", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    fleet = [row for row in rows if row["group"] == "fleet"]
    assert [row["name"].split(": ")[1] for row in fleet] == [
        "1 controller, no etcd (baseline)",
        "1 controller leasing from etcd",
        "3 controllers leasing from one etcd",
    ]
    for row in fleet:
        assert row["per_second"] > 0, row
        # Measured over the load's window, from /proc: each side did work.
        assert 0 < row["controllers_cores"] <= 2.0 and 0 < row["loadgen_cores"] <= 2.0, row
    assert fleet[0]["vs_single"] == 1.0
    assert fleet[2]["etcd_txns_per_million_pids"] > 0
