"""The Python processes the tests and benchmarks start run as installed: without hypothesis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.bench.common import ceiling_process
from ops.testing.serverproc import (
    WITHOUT_HYPOTHESIS,
    ServerProcess,
    wait_until,
    without_hypothesis,
)
from pidctl.client import SyncClient
from pidctl.protocol import requests

#: What a pidctl server imports (kio, which imports hypothesis where it can), then what it
#: would suffer from hypothesis: trio's scheduler made deterministic by hypothesis's plugin.
PROBE = (
    "import sys\n"
    "import pidctl.controller.server.app\n"
    "import trio._core._run as run\n"
    "print('hypothesis' in sys.modules, run._ALLOW_DETERMINISTIC_SCHEDULING)\n"
)


def _probe(env: dict[str, str]) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def _bare_environ() -> dict[str, str]:
    """This process's environment without the stand-in the test session puts on the path."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    kept = [p for p in kept if p != str(WITHOUT_HYPOTHESIS)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(kept)}


def test_a_process_started_without_hypothesis_imports_none_and_schedules_as_trio_does() -> None:
    bare = _bare_environ()
    assert _probe(bare) == ["True", "True"]  # what the stand-in prevents, here
    assert _probe(without_hypothesis(bare)) == ["False", "False"]


def test_the_stand_in_is_put_first_once() -> None:
    env = without_hypothesis({"PYTHONPATH": "/somewhere"})
    assert env["PYTHONPATH"] == os.pathsep.join([str(WITHOUT_HYPOTHESIS), "/somewhere"])
    assert without_hypothesis(env) == env
    assert without_hypothesis({})["PYTHONPATH"] == str(WITHOUT_HYPOTHESIS)


def _started_with(pid: int) -> list[str]:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    paths = [e[len(b"PYTHONPATH=") :] for e in environ if e.startswith(b"PYTHONPATH=")]
    return os.fsdecode(paths[0]).split(os.pathsep) if paths else []


def test_the_benchmarks_servers_start_without_hypothesis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside a test session nothing else puts the stand-in on the path (a benchmark)."""
    monkeypatch.setenv("PYTHONPATH", _bare_environ()["PYTHONPATH"])
    with ceiling_process() as (_, pid):
        assert _started_with(pid)[0] == str(WITHOUT_HYPOTHESIS)
    with ServerProcess(tmp_path / "data") as server:
        assert server.proc is not None
        assert _started_with(server.proc.pid)[0] == str(WITHOUT_HYPOTHESIS)


def test_a_measured_servers_log_is_read_unparsed_after_it_listens(tmp_path: Path) -> None:
    """A benchmark's server (``events_after_start=False``) keeps only the start-up's events,
    and its log is still read: a grant's audit line each, far more than a pipe holds
    (64 KiB), and the server answers every grant, never blocked on a full pipe."""
    grants = 2000
    with ServerProcess(tmp_path / "d", events_after_start=False) as server:
        started = len(server.events)
        assert server.event("listening")
        with SyncClient(server.bootstrap) as client:
            for _ in range(grants):
                assert client.request(requests.allocate(-1, -1)).error_code == 0
        assert len(server.events) == started  # nothing parsed or kept after the start
    logged = ServerProcess(tmp_path / "kept")
    with logged, SyncClient(logged.bootstrap) as client:
        assert client.request(requests.allocate(-1, -1)).error_code == 0
        wait_until(
            lambda: any(e.get("event") == "producer ids granted" for e in logged.events),
            "the default keeps the grant's audit line",
        )
