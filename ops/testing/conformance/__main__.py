"""``python -m ops.testing.conformance coverage``: the coverage report (Kafka's branches and
the corpus steps that reach them, ``branches.py``).

``python -m ops.testing.conformance classes``: the Java client's KIP-1050 class of every
error code the corpus compares (``error_classes.py``).

``python -m ops.testing.conformance record [CASE ...]``: start a Kafka node, replay the
corpus (every case, or those named) against it and write its answers as golden files (a
case that needs a fresh node gets one of its own)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from ops.testing.conformance.corpus import CASES, CASES_BY_NAME, Case
from ops.testing.conformance.coverage import branch_problems, branch_report, codes_compared
from ops.testing.conformance.error_classes import ask_the_client, write_classes
from ops.testing.conformance.golden import kafka_version, write_golden
from ops.testing.conformance.replay import replay
from ops.testing.conformance.targets import kafka_node, kafka_target, warm_up


def record(names: list[str]) -> int:
    unknown = [name for name in names if name not in CASES_BY_NAME]
    if unknown:
        print(f"error: unknown cases: {', '.join(unknown)}", file=sys.stderr)
        return 2
    cases = [CASES_BY_NAME[name] for name in names] if names else list(CASES)
    version = kafka_version()
    for fresh in (True, False):
        batch = [case for case in cases if case.fresh_node is fresh]
        if batch:
            _record_on_one_node(batch, version, warm=not fresh)
    return 0


def _record_on_one_node(cases: list[Case], version: str, *, warm: bool) -> None:
    """Record ``cases`` on one new Kafka node, warmed up first unless the cases need it
    fresh (each fresh case then gets a node of its own)."""
    if not warm and len(cases) > 1:
        for case in cases:
            _record_on_one_node([case], version, warm=False)
        return
    started = time.monotonic()
    with kafka_node() as node:
        print(f"Kafka {version} up in {time.monotonic() - started:.0f} s", flush=True)
        if warm:
            warm_up(node)
        for case in cases:
            began = time.monotonic()
            steps = replay(case, kafka_target(node, case.profile), from_source=True)
            path = write_golden(case, steps, version)
            print(f"{case.name}: {len(steps)} steps in {time.monotonic() - began:.1f} s -> {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.testing.conformance")
    commands = parser.add_subparsers(dest="command", required=True)
    recording = commands.add_parser("record", help="record Kafka's answers as golden files")
    recording.add_argument("cases", nargs="*", help="case names (default: every case)")
    commands.add_parser(
        "coverage", help="print Kafka's validation branches and the corpus steps reaching each"
    )
    commands.add_parser(
        "classes", help="record the Java client's KIP-1050 class of every error code compared"
    )
    arguments = parser.parse_args(argv)
    if arguments.command == "classes":
        with tempfile.TemporaryDirectory() as build:
            classes = ask_the_client(codes_compared(), Path(build))
        print(f"{len(classes)} codes -> {write_classes(classes, kafka_version())}")
        return 0
    if arguments.command == "coverage":
        problems = branch_problems()
        print(branch_report())
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1 if problems else 0
    return record(arguments.cases)


if __name__ == "__main__":
    sys.exit(main())
