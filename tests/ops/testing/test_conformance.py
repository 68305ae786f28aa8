"""pidctl against Kafka's own answers: the conformance corpus (ops/testing/conformance/)
replayed against pidctl and compared, field by field, with what Kafka 4.4 answered
(the golden files, recorded with ``python -m ops.testing.conformance record``). No JVM:
the live comparison with Kafka is tests/ops/testing/test_conformance_live.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.testing.conformance.__main__ import main as conformance_main
from ops.testing.conformance.branches import BRANCHES
from ops.testing.conformance.corpus import CASES, PROFILES
from ops.testing.conformance.coverage import (
    DECIDERS,
    answered_codes,
    branch_problems,
    branch_report,
    codes_compared,
    error_codes_by_api,
    unlisted_deciders,
)
from ops.testing.conformance.differences import (
    ABSENT,
    DELIBERATE,
    Deliberate,
    Difference,
    differences,
    undeclared,
    unused,
)
from ops.testing.conformance.error_classes import class_changes, class_table, read_classes
from ops.testing.conformance.golden import GOLDEN_DIR, golden_path, read_golden
from ops.testing.conformance.replay import Target, replay
from ops.testing.conformance.targets import pidctl_targets

DOC = Path(__file__).parents[3] / "docs" / "kafka-conformance.md"


@pytest.fixture(scope="module")
def pidctl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Target]]:
    """A pidctl server for each profile of the corpus."""
    with pidctl_targets(tmp_path_factory.mktemp("conformance")) as targets:
        yield targets


def test_pidctl_answers_as_kafka_did_but_for_the_declared_differences(
    pidctl: dict[str, Target],
) -> None:
    replays = {case.name: replay(case, pidctl[case.profile]) for case in CASES}
    found: list[Difference] = []
    for case in CASES:
        found += differences(case.name, read_golden(case)["steps"], replays[case.name])

    stale_golden = [d for d in found if not d.path.startswith(("answer", "answers"))]
    assert not stale_golden, (
        "the corpus sends other requests than the golden files record: re-record "
        "(python -m ops.testing.conformance record):\n" + "\n".join(map(str, stale_golden))
    )
    assert not undeclared(found, DELIBERATE), "differences from Kafka nobody declared:\n" + (
        "\n".join(map(str, undeclared(found, DELIBERATE)))
    )
    assert not unused(found, DELIBERATE), "declared differences that no longer occur:\n" + (
        "\n".join(f"{d.id}: {d}" for d in unused(found, DELIBERATE))
    )
    # KIP-1050: where pidctl's error differs from Kafka's, a client puts it in the same class
    # (retriable, abortable, fatal...), or the declaration says why not.
    changed = class_changes(found, DELIBERATE, read_classes())
    assert not changed, "errors a client would handle otherwise than Kafka's:\n" + "\n".join(
        changed
    )

    # The corpus reaches every error code pidctl's code can answer these APIs with.
    answered = answered_codes(replays.values())
    missing = {
        api.name: sorted(codes - answered.get(api, set()))
        for api, codes in error_codes_by_api().items()
        if codes - answered.get(api, set())
    }
    assert not missing, f"error codes no case of the corpus brings about: {missing}"


def test_error_codes_are_read_from_every_deciding_function() -> None:
    assert unlisted_deciders() == []
    codes = error_codes_by_api()
    assert set(codes) == set(DECIDERS)
    # What the code says, as the README says it: a sample, so a reader can check the reader.
    assert {14, 42, 47, 50, 90} <= codes[next(a for a in codes if a.name == "INIT_PRODUCER_ID")]


def test_every_branch_of_kafkas_code_is_reached_or_explained() -> None:
    # Each step named reaches its branch in Kafka's recorded answers; every branch has steps
    # or the reason no request can reach it (branches.py; the report: `coverage`).
    assert branch_problems() == []
    report = branch_report()
    assert report.count("\n| ") >= len(BRANCHES)
    reachable = [branch for branch in BRANCHES if not branch.unreachable]
    assert all(branch.steps for branch in reachable)


def test_every_error_code_compared_has_its_class_and_the_table_is_documented() -> None:
    classes = read_classes()
    assert codes_compared() <= set(classes), "re-record: python -m ops.testing.conformance classes"
    assert class_table(classes) in DOC.read_text(), (
        "docs/kafka-conformance.md's KIP-1050 table is not error_classes.class_table()'s"
    )


def test_a_class_change_needs_a_declaration_that_says_so() -> None:
    classes = {3: {"class": "refresh-retriable"}, 17: {"class": "invalid-configuration"}}
    difference = Difference("c", "s", "answer.topics.0.error_code", 17, 3)
    assert class_changes([difference], [], classes)
    declared = Deliberate("x", "why", path="answer.*")
    assert class_changes([difference], [declared], classes)
    assert not class_changes([difference], [Deliberate("x", "why", changes_class=True)], classes)
    same = Difference("c", "s", "answer.error_code", 3, 3)
    assert not class_changes([same], [], classes)


def test_golden_files_are_the_corpus() -> None:
    assert {path.stem for path in GOLDEN_DIR.glob("*.json")} == {case.name for case in CASES}
    for case in CASES:
        golden = read_golden(case)
        assert (golden["case"], golden["profile"]) == (case.name, case.profile)
        assert [step["step"] for step in golden["steps"]] == [step.name for step in case.steps]
        for step, recorded in zip(case.steps, golden["steps"], strict=True):
            if step.kafka_source is not None:
                # Answers from Kafka's source are the corpus's own, with where they come from.
                assert recorded["answer"] == dict(step.kafka_source.answer), step.name
                assert recorded["source"] == step.kafka_source.source
            else:
                assert "source" not in recorded, step.name
        # Small enough to review (the longest lists are summarised).
        assert golden_path(case).stat().st_size < 32_000, case.name


def test_every_profile_is_used_and_every_declaration_documented() -> None:
    assert {case.profile for case in CASES} == set(PROFILES)
    text = DOC.read_text()
    for item in DELIBERATE:
        assert f"`{item.id}`" in text, f"docs/kafka-conformance.md does not explain {item.id}"


def test_a_declaration_matches_only_what_it_names() -> None:
    declared = Deliberate("x", "why", case="c*", step="s", path=("a.b", "a.c.*"), pidctl=ABSENT)
    assert declared.matches(Difference("case", "s", "a.c.1", 1, ABSENT))
    assert not declared.matches(Difference("case", "s", "a.c.1", 1, 2))  # pidctl has it
    assert not declared.matches(Difference("case", "t", "a.b", 1, ABSENT))  # another step
    assert not declared.matches(Difference("other", "s", "a.b", 1, ABSENT))
    assert undeclared([Difference("case", "s", "a.d", 1, ABSENT)], [declared])
    assert unused([], [declared]) == [declared]


def test_differences_are_field_by_field() -> None:
    kafka = [{"step": "s", "listener": "broker", "request": {"api": "X"}, "answer": {"a": 1}}]
    pidctl = [{**kafka[0], "answer": {"a": 2, "b": [1]}}]
    found = differences("c", kafka, pidctl)
    assert [(d.path, d.kafka, d.pidctl) for d in found] == [
        ("answer.a", 1, 2),
        ("answer.b.0", ABSENT, 1),
    ]
    assert json.dumps([str(d) for d in found])  # printable


def test_record_refuses_unknown_cases(capsys: pytest.CaptureFixture[str]) -> None:
    assert conformance_main(["record", "no-such-case", "metadata"]) == 2
    assert "unknown cases: no-such-case" in capsys.readouterr().err
