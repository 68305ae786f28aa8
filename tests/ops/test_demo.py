"""`ops/dev.sh demo` as the README gives it: a real Kafka node, a pidctl granting from 2^62 and a
Spark standalone cluster, the same job through Spark's Kafka sink and through
``pidctl-kafka``, the executors killed mid-write; its table has the README's shape, Spark's
sink wrote rows twice and ``pidctl-kafka`` wrote every row once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests import docs

ROOT = docs.ROOT
SECTION = ("README.md", "Exactly once you can watch")
ROW = re.compile(r"^(.*?)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)$")


def _counts(line: str) -> tuple[str, int, int, int]:
    match = ROW.match(line)
    assert match is not None, line
    name, *numbers = match.groups()
    rows, twice, missing = (int(n.replace(",", "")) for n in numbers)
    return name, rows, twice, missing


@pytest.mark.slow
def test_the_demo_shows_spark_duplicating_and_pidctl_kafka_not(tmp_path: Path) -> None:
    [command] = docs.commands(docs.block(*SECTION, 0))
    assert command == "ops/dev.sh demo"
    shown = docs.block(*SECTION, 1).splitlines()
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=ROOT,
        env={**os.environ, "VENV": str(Path(sys.executable).parent.parent)},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    start = lines.index(shown[0])
    table = lines[start : start + len(shown)]
    assert table[:3] == shown[:3]  # the heading and the columns, as the README prints them
    spark, pidctl = (_counts(line) for line in table[3:])
    assert [spark[0], pidctl[0]] == [_counts(line)[0] for line in shown[3:]]
    _, rows, twice, missing = spark
    assert twice > 0 and missing == 0 and rows == 20_000 + twice, spark
    assert pidctl[1:] == (20_000, 0, 0), pidctl
