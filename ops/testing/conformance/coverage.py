"""Which error codes pidctl can answer each API with, read from its code, and which its
answers over the corpus carry: the corpus must reach every one.

:data:`DECIDERS` names, per API, the functions that decide its answer (the handler and the
managers' decisions it calls). Their code is read (ast): every ``ErrorCode.x`` in it, and
every module-level name it uses whose value is an ErrorCode (``LEASE_EXHAUSTED``) or an
answer carrying one (``_NO_PID``). :func:`unlisted_deciders` finds any function of the
deciding modules that names an error code and is in no list, so a new path cannot hide.
"""

from __future__ import annotations

import ast
import functools
import importlib
from collections.abc import Iterable, Iterator
from typing import Any

from kio.schema.errors import ErrorCode

from ops.compiled import source_file
from pidctl.controller.api import responses
from pidctl.protocol.apis import ApiKey

#: Per API, the functions (``module:qualified.name``) that decide its answers.
DECIDERS: dict[ApiKey, tuple[str, ...]] = {
    ApiKey.INIT_PRODUCER_ID: (
        "pidctl.controller.api.init_producer_id:InitProducerIdHandler.init_producer_id",
        "pidctl.controller.api.init_producer_id:InitProducerIdHandler.init_idempotent_run",
        "pidctl.controller.api.init_producer_id:InitProducerIdHandler._idempotent_run",
        "pidctl.controller.core.transactions:parse_expected",
        "pidctl.controller.core.transactions:TransactionControlManager.init_idempotent",
        "pidctl.controller.core.transactions:TransactionControlManager.init_transactional",
    ),
    ApiKey.API_VERSIONS: (
        "pidctl.controller.api.handlers:Controller._api_versions",
        "pidctl.controller.api.responses:ApiVersionsAnswers.reply",
        "pidctl.protocol.api_versions:build_api_versions_response",
        "pidctl.protocol.api_versions:unsupported_version_response",
        "pidctl.protocol.api_versions:invalid_request_response",
    ),
    ApiKey.FIND_COORDINATOR: (
        "pidctl.controller.api.metadata_apis:MetadataApis.find_coordinator",
        "pidctl.controller.api.responses:too_many_keys",
    ),
    ApiKey.METADATA: (
        "pidctl.controller.api.metadata_apis:MetadataApis.metadata",
        "pidctl.controller.api.metadata_apis:MetadataApis._unknown_topics",
        "pidctl.controller.api.responses:too_many_topics",
        "pidctl.controller.api.responses:metadata_refusal",
    ),
    ApiKey.BROKER_REGISTRATION: (
        "pidctl.controller.api.cluster_apis:ClusterApis.broker_registration",
        "pidctl.controller.core.cluster:ClusterControlManager.register",
    ),
    ApiKey.BROKER_HEARTBEAT: (
        "pidctl.controller.api.cluster_apis:ClusterApis.broker_heartbeat",
        "pidctl.controller.core.cluster:ClusterControlManager.heartbeat",
        "pidctl.controller.core.cluster:ClusterControlManager.check_broker_epoch",
    ),
    ApiKey.UNREGISTER_BROKER: (
        "pidctl.controller.api.cluster_apis:ClusterApis.unregister_broker",
        "pidctl.controller.core.cluster:ClusterControlManager.unregister",
    ),
    ApiKey.ALLOCATE_PRODUCER_IDS: (
        "pidctl.controller.api.allocate_producer_ids:AllocateProducerIdsHandler.allocate_producer_ids",
        "pidctl.controller.core.cluster:ClusterControlManager.check_broker_epoch",
        "pidctl.controller.core.producer_ids:ProducerIdControlManager._grant",
        "pidctl.controller.core.jobs:JobAllocationManager.allocate",
        "pidctl.controller.api.allocate_producer_ids:AllocateProducerIdsHandler.app_id_refusal",
        "pidctl.controller.core.jobs:JobAllocationManager.refusal",
    ),
}

#: The modules whose functions decide answers (searched by :func:`unlisted_deciders`).
DECIDING_MODULES = (
    "pidctl.controller.api.handlers",
    "pidctl.controller.api.init_producer_id",
    "pidctl.controller.api.allocate_producer_ids",
    "pidctl.controller.api.cluster_apis",
    "pidctl.controller.api.metadata_apis",
    "pidctl.controller.api.responses",
    "pidctl.controller.core.cluster",
    "pidctl.controller.core.producer_ids",
    "pidctl.controller.core.transactions",
    "pidctl.controller.core.jobs",
    "pidctl.protocol.api_versions",
)

#: Functions of those modules that name an error code but decide none of the APIs above.
NOT_THESE_APIS: dict[str, str] = {
    "pidctl.controller.api.cluster_apis:ClusterApis.describe_cluster": "DescribeCluster",
    "pidctl.controller.api.handlers:Controller.handle": (
        "the RecordTooLarge refusal: INVALID_REQUEST for each API of responses.REFUSALS, "
        "added by error_codes_by_api"
    ),
}

#: (API, code) pairs the code names but no request can bring about, with the reason.
UNREACHABLE: dict[tuple[ApiKey, int], str] = {
    (ApiKey.UNREGISTER_BROKER, ErrorCode.invalid_request.value): (
        "the RecordTooLarge refusal: its record holds a broker id and an epoch, never too "
        "large for the log"
    ),
    (ApiKey.ALLOCATE_PRODUCER_IDS, ErrorCode.kafka_storage_error.value): (
        "grants paused for a nearly full data dir (data_dir_min_free_bytes): a filesystem "
        "brings it about, not a request (tests/controller/api/test_handlers.py, "
        "tests/e2e/test_log_operations.py)"
    ),
}


@functools.cache  # (a module is read once, not once per function asked of it)
def _definitions(module_name: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The module's functions and methods written in its file, by their qualified names,
    read from its source (compiled, a function has no code to inspect)."""
    tree = ast.parse(source_file(importlib.import_module(module_name)).read_text())
    found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                    found[f"{node.name}.{member.name}"] = member
    return found


def _error_code_of(value: Any) -> ErrorCode | None:
    if isinstance(value, ErrorCode):
        return value
    error = getattr(value, "error", None)
    return error if isinstance(error, ErrorCode) else None


def _codes(qualified: str) -> set[int]:
    """The error codes a function's own code names (``module:Class.method``)."""
    module_name, _, name = qualified.partition(":")
    names = vars(importlib.import_module(module_name))
    codes: set[int] = set()
    for node in ast.walk(_definitions(module_name)[name]):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "ErrorCode"
        ):
            codes.add(ErrorCode[node.attr].value)
        elif isinstance(node, ast.Name) and node.id in names:
            code = _error_code_of(names[node.id])
            if code is not None:
                codes.add(code.value)
    return codes


def error_codes_by_api() -> dict[ApiKey, set[int]]:
    """Per API, every error code pidctl's code can answer it with (0, NONE, always), less
    what :data:`UNREACHABLE` explains."""
    found = {
        api: {ErrorCode.none.value}.union(*(_codes(f) for f in functions))
        for api, functions in DECIDERS.items()
    }
    for api in responses.REFUSALS:  # Controller.handle's refusal of a record too large
        found[ApiKey(api)].add(ErrorCode.invalid_request.value)
    for api, code in UNREACHABLE:
        found[api].discard(code)
    return found


def unlisted_deciders() -> list[str]:
    """Functions of :data:`DECIDING_MODULES` that name an error code (other than NONE) and
    are neither in :data:`DECIDERS` nor in :data:`NOT_THESE_APIS`."""
    listed = {f for functions in DECIDERS.values() for f in functions} | set(NOT_THESE_APIS)
    unlisted = []
    for module_name in DECIDING_MODULES:
        for name in _definitions(module_name):
            qualified = f"{module_name}:{name}"
            if qualified not in listed and _codes(qualified) - {ErrorCode.none.value}:
                unlisted.append(qualified)
    return unlisted


def _answer_codes(answer: Any) -> Iterator[int]:
    if isinstance(answer, dict):
        for key, value in answer.items():
            if key == "error_code" and isinstance(value, int):
                yield value
            elif key == "error_codes" and isinstance(value, dict):
                yield from (int(code) for code in value)
            else:
                yield from _answer_codes(value)
    elif isinstance(answer, list):
        for item in answer:
            yield from _answer_codes(item)


def answered_codes(replays: Iterable[list[Any]]) -> dict[ApiKey, set[int]]:
    """Per API, the error codes the replayed steps' answers carry (their summaries too)."""
    found: dict[ApiKey, set[int]] = {}
    for steps in replays:
        for step in steps:
            if step["request"]["api"] not in ApiKey.__members__:
                continue  # an API key no one knows (request-parsing): closed unanswered
            api = ApiKey[step["request"]["api"]]
            codes = found.setdefault(api, set())
            codes.update(_answer_codes(step["answer"]))
            codes.update(_answer_codes(step.get("answers", {})))
    return found


# -- Kafka's branches (branches.py) ----------------------------------------------------------


def _golden_steps() -> dict[str, dict[str, Any]]:
    """Every recorded step by ``case/step``."""
    from ops.testing.conformance.corpus import CASES
    from ops.testing.conformance.golden import read_golden

    return {
        f"{case.name}/{step['step']}": step for case in CASES for step in read_golden(case)["steps"]
    }


def branch_problems() -> list[str]:
    """What is wrong with :data:`~ops.testing.conformance.branches.BRANCHES`: a branch with
    neither a step nor a reason (or both), a step the corpus does not have, or one where
    Kafka's recorded answer is not the branch's."""
    from ops.testing.conformance.branches import ANSWERED, BRANCHES, CLOSED

    recorded = _golden_steps()
    problems = []
    for branch in BRANCHES:
        label = f"{branch.api}: {branch.when}"
        if bool(branch.steps) == bool(branch.unreachable):
            problems.append(f"{label}: needs steps or a reason none can reach it, not both")
        for name in branch.steps:
            step = recorded.get(name)
            if step is None:
                problems.append(f"{label}: no step {name} in the corpus")
                continue
            answer = step["answer"]
            if branch.code in (CLOSED, ANSWERED):
                reached = (answer == {"closed": True}) == (branch.code == CLOSED)
            else:
                codes = set(_answer_codes(answer)) | set(_answer_codes(step.get("answers", {})))
                reached = branch.code in codes
            if not reached:
                problems.append(f"{label}: Kafka's answer at {name} is not {branch.code}")
    return problems


def branch_report() -> str:
    """The coverage report (Markdown): each branch of Kafka's code, Kafka's answer there,
    and the corpus steps that reach it or why none can; then a summary per API."""
    from ops.testing.conformance.branches import BRANCHES

    lines = [
        "| API | Kafka's code | when | Kafka answers | covered by |",
        "|---|---|---|---|---|",
    ]
    summary: dict[str, list[int]] = {}
    for branch in BRANCHES:
        covered = "<br>".join(f"`{step}`" for step in branch.steps)
        lines.append(
            f"| {branch.api} | `{branch.where}` | {branch.when} | {branch.code} | "
            f"{covered or 'none: ' + branch.unreachable} |"
        )
        counts = summary.setdefault(branch.api, [0, 0])
        counts[0 if branch.steps else 1] += 1
    lines += ["", "| API | branches covered | branches no request can reach |", "|---|---|---|"]
    for api, (covered_count, unreachable_count) in summary.items():
        lines.append(f"| {api} | {covered_count} | {unreachable_count} |")
    covered_total = sum(counts[0] for counts in summary.values())
    unreachable_total = sum(counts[1] for counts in summary.values())
    lines.append(f"| all | {covered_total} | {unreachable_total} |")
    return "\n".join(lines)


def codes_compared() -> set[int]:
    """Every error code Kafka's recorded answers carry or pidctl's code can answer with."""
    from ops.testing.conformance.corpus import CASES
    from ops.testing.conformance.golden import read_golden

    codes = set().union(*error_codes_by_api().values())
    for case in CASES:
        for step in read_golden(case)["steps"]:
            codes.update(_answer_codes(step["answer"]))
            codes.update(_answer_codes(step.get("answers", {})))
    return codes
