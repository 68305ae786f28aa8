"""The job-state benchmark in its short form: both runs load a real server, the one beside
the app ids while snapshots of them are written, and it says what an app id costs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.bench import job_state
from pidctl.controller.core.state import ControllerState
from pidctl.controller.log.recovery import recover


@pytest.mark.slow
def test_a_short_run_measures_beside_snapshots_of_the_app_ids(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A snapshot comes due once the log has grown by the last snapshot's size: app ids few
    # enough (0.6 MB of snapshot) that a slow machine's load writes that much in the window.
    argv = ["--app-ids", "6000", "--principals", "20", "--seconds", "12", "--connections", "2"]
    argv += ["--snapshot-every", "100"]
    job_state.main([*argv, "--build", "interpreted"])
    result = json.loads(capsys.readouterr().out)
    loaded, base = result["with_app_ids"], result["baseline"]
    assert loaded["requests"] > 0 and base["requests"] > 0
    # The window held snapshots of the whole job state (else it measured nothing of them).
    assert loaded["snapshots_during_load"] >= 1
    assert 30 < result["snapshot_bytes_per_app_id"] < 200
    assert result["rss_bytes_per_app_id"] > 0
    assert result["p99_ratio"] == round(loaded["p99_ms"] / base["p99_ms"], 2)


def test_the_app_ids_are_decided_by_the_job_manager_and_owned(tmp_path: Path) -> None:
    data_dir = tmp_path / "d"
    job_state.write_app_ids(data_dir, 300, principals=3)
    state: ControllerState = recover(data_dir).state
    assert len(state.jobs.apps) == 300
    assert {state.jobs.apps.held_by(f"User:tenant-{i}") for i in range(3)} == {100}
