"""What the benchmarks share."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from ops.bench.common import ROOT

#: A benchmark's shape: a temporary directory held while it runs.
HOLDS_A_DIRECTORY = """
import sys, tempfile, time
from ops.bench.common import exit_on_sigterm
exit_on_sigterm()
with tempfile.TemporaryDirectory(dir=sys.argv[1]) as tmp:
    print(tmp, flush=True)
    time.sleep(600)
"""


def test_sigterm_ends_a_benchmark_as_ctrl_c_does_its_directories_removed(
    tmp_path: Path,
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDS_A_DIRECTORY, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        held = Path(proc.stdout.readline().strip())
        assert held.is_dir()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert not held.exists()
