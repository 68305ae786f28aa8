"""Kafka's recorded answers: one JSON file per case in ``golden/``, written by
``python -m ops.testing.conformance record`` and reviewed like code."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ops.testing.conformance.corpus import Case
from ops.testing.jars import classpath

GOLDEN_DIR = Path(__file__).parent / "golden"
RECORD_COMMAND = "python -m ops.testing.conformance record"


def golden_path(case: Case) -> Path:
    """Where ``case``'s golden file lives."""
    return GOLDEN_DIR / f"{case.name}.json"


def kafka_version() -> str:
    """The Kafka version of the fetched jars (``kafka_2.13-4.4.0.jar`` → ``4.4.0``)."""
    match = re.search(r"kafka_2\.13-([0-9][^/:]*)\.jar", classpath("kafka"))
    if match is None:
        raise RuntimeError("no kafka_2.13 jar in the kafka class path")
    return match[1]


def write_golden(case: Case, steps: list[Any], version: str) -> Path:
    """Write ``case``'s golden file: Kafka's normalised answers, step by step."""
    document = {
        "case": case.name,
        "about": case.about,
        "profile": case.profile,
        "kafka": version,
        "recorded_with": RECORD_COMMAND,
        "steps": steps,
    }
    path = golden_path(case)
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def read_golden(case: Case) -> dict[str, Any]:
    """``case``'s golden file; FileNotFoundError names the command that records it."""
    path = golden_path(case)
    try:
        document: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no golden file {path}: run {RECORD_COMMAND}") from None
    return document
