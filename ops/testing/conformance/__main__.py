"""``python -m ops.testing.conformance record [CASE ...]``: start a Kafka node, replay the
corpus (every case, or those named) against it and write its answers as golden files."""

from __future__ import annotations

import argparse
import sys
import time

from ops.testing.conformance.corpus import CASES, CASES_BY_NAME
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
    started = time.monotonic()
    with kafka_node() as node:
        print(f"Kafka {version} up in {time.monotonic() - started:.0f} s; warming up", flush=True)
        warm_up(node)
        for case in cases:
            began = time.monotonic()
            steps = replay(case, kafka_target(node, case.profile), from_source=True)
            path = write_golden(case, steps, version)
            print(f"{case.name}: {len(steps)} steps in {time.monotonic() - began:.1f} s -> {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.testing.conformance")
    commands = parser.add_subparsers(dest="command", required=True)
    recording = commands.add_parser("record", help="record Kafka's answers as golden files")
    recording.add_argument("cases", nargs="*", help="case names (default: every case)")
    arguments = parser.parse_args(argv)
    return record(arguments.cases)


if __name__ == "__main__":
    sys.exit(main())
