"""The Python processes the tests and benchmarks start run as installed: without hypothesis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.bench.common import ceiling_process
from ops.testing.serverproc import WITHOUT_HYPOTHESIS, ServerProcess, without_hypothesis

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
