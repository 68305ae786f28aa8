"""KIP-1050's error classes as Kafka 4.4's Java client gives them: for each error code, the
exception ``Errors.forCode(code).exception()`` makes and whether it is retriable (refresh
metadata first, or not), abortable, application-recoverable, an invalid configuration, or
fatal (``java/ErrorClasses.java``, run against the ``kafka`` jar set's kafka-clients).

The classes are kept in ``error_classes.json`` beside this file, so that the suite checks
them without a JVM; ``python -m ops.testing.conformance classes`` records them again (and
tests/ops/testing/test_conformance_live.py checks the client still says the same).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ops.testing.conformance.differences import Deliberate, Difference
from ops.testing.jars import classpath
from ops.testing.java import compile_java, require_java

CLASSES_FILE = Path(__file__).parent / "error_classes.json"
PROGRAM = Path(__file__).parents[1] / "java" / "ErrorClasses.java"
#: How long the program may take (a JVM start on a busy machine).
RUN_TIMEOUT_S = 120.0


def ask_the_client(codes: Iterable[int], build_dir: Path) -> dict[int, dict[str, Any]]:
    """Each code's exception and class, as the Java client gives them now."""
    path = classpath("kafka")
    classes = compile_java([PROGRAM], path, build_dir)
    result = subprocess.run(
        [require_java(), "-cp", f"{classes}:{path}", "ErrorClasses", *map(str, sorted(codes))],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=True,
    )
    entries = (json.loads(line) for line in result.stdout.splitlines() if line.strip())
    return {int(entry["code"]): entry for entry in entries}


def write_classes(classes: dict[int, dict[str, Any]], version: str) -> Path:
    """Keep ``classes`` in :data:`CLASSES_FILE`."""
    document = {
        "kafka_clients": version,
        "recorded_with": "python -m ops.testing.conformance classes",
        "classes": [classes[code] for code in sorted(classes)],
    }
    CLASSES_FILE.write_text(json.dumps(document, indent=1) + "\n")
    return CLASSES_FILE


def read_classes() -> dict[int, dict[str, Any]]:
    """The recorded classes, by error code."""
    document = json.loads(CLASSES_FILE.read_text())
    return {int(entry["code"]): entry for entry in document["classes"]}


def class_of(code: int, classes: dict[int, dict[str, Any]]) -> str:
    """The KIP-1050 class of ``code`` (KeyError if it was not recorded)."""
    return str(classes[code]["class"])


def class_changes(
    found: Iterable[Difference],
    declared: Iterable[Deliberate],
    classes: dict[int, dict[str, Any]],
) -> list[str]:
    """The differences in an error code that put a client in another KIP-1050 class than
    Kafka's answer does, unless the declaration covering them says it does so on purpose
    (``changes_class``)."""
    declared = tuple(declared)
    problems = []
    for difference in found:
        if not difference.path.endswith("error_code"):
            continue
        kafka, pidctl = difference.kafka, difference.pidctl
        if not (isinstance(kafka, int) and isinstance(pidctl, int)):
            continue
        if class_of(kafka, classes) == class_of(pidctl, classes):
            continue
        if any(d.changes_class and d.matches(difference) for d in declared):
            continue
        problems.append(
            f"{difference}: {class_of(kafka, classes)} from Kafka, "
            f"{class_of(pidctl, classes)} from pidctl"
        )
    return problems


def class_table(classes: dict[int, dict[str, Any]]) -> str:
    """The documented table (Markdown): per API, every error code pidctl can answer it with
    (coverage.error_codes_by_api) and its KIP-1050 class in Kafka 4.4's Java client."""
    from ops.testing.conformance.coverage import error_codes_by_api

    lines = ["| API | error code | class (Java client 4.4) | exception |", "|---|---|---|---|"]
    for api, codes in error_codes_by_api().items():
        name = "".join(part.title() for part in api.name.split("_"))
        for code in sorted(codes):
            entry = classes[code]
            exception = entry["exception"].rsplit(".", 1)[-1] or "-"
            lines.append(f"| {name} | {code} {entry['name']} | {entry['class']} | {exception} |")
    return "\n".join(lines)
