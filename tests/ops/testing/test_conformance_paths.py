"""Every path checked: the whole conformance corpus replayed against pidctl in each
configuration that changes the path a request takes through it (the interpreted and the
compiled build, quotas on, the request log on, SASL, TLS: targets.CONFIGURATIONS), with the
same names in every replay, and every answer compared byte for byte with the first
configuration's (but for the correlation ids, which the client picks); each configuration's
answers are also held to Kafka's (the golden files, but for the declared differences).

A change to how a request is read or answered (a reader of its own per API, say) must leave
every row here green: the bytes a client gets do not depend on the way its request took."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.testing.conformance.corpus import CASES
from ops.testing.conformance.differences import DELIBERATE, differences, undeclared
from ops.testing.conformance.golden import read_golden
from ops.testing.conformance.replay import replay
from ops.testing.conformance.targets import CONFIGURATIONS, Identity, pidctl_targets

#: The configuration every other is compared with.
BASELINE = "interpreted"
#: The names every replay makes (Context's run and broker ids) come from this and the
#: case's place in the corpus: the same requests in every configuration, no two cases alike.
SEED = 54_000

Answers = dict[str, list[tuple[str, bytes]]]


def _without_correlation_ids(wire: bytes) -> bytes:
    """A step's answer frames with their correlation ids zeroed: the one part of an answer
    the client chooses (a SASL login before the replay takes some), not the server."""
    frames = bytearray(wire)
    at = 0
    while at + 8 <= len(frames):
        frames[at + 4 : at + 8] = bytes(4)
        at += 4 + int.from_bytes(frames[at : at + 4], "big")
    return bytes(frames)


def _replay_corpus(configuration: str, directory: Path) -> tuple[Answers, list[str]]:
    """Every case against pidctl in ``configuration``: per case, each step's answer bytes;
    and the differences from Kafka's golden answers that no declaration covers."""
    wires: Answers = {}
    found = []
    with pidctl_targets(
        directory, configuration=CONFIGURATIONS[configuration], identity=Identity()
    ) as targets:
        for index, case in enumerate(CASES):
            wire: list[bytes] = []
            steps = replay(case, targets[case.profile], seed=SEED + index, wire=wire)
            wires[case.name] = [
                (step["step"], _without_correlation_ids(data))
                for step, data in zip(steps, wire, strict=True)
            ]
            found += differences(case.name, read_golden(case)["steps"], steps)
    return wires, [str(d) for d in undeclared(found, DELIBERATE)]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Answers]:
    wires, unexplained = _replay_corpus(BASELINE, tmp_path_factory.mktemp(BASELINE))
    assert not unexplained, "\n".join(unexplained)
    yield wires


@pytest.mark.slow
@pytest.mark.parametrize("configuration", [name for name in CONFIGURATIONS if name != BASELINE])
def test_every_path_answers_the_corpus_byte_for_byte_alike(
    configuration: str, baseline: Answers, tmp_path: Path
) -> None:
    wires, unexplained = _replay_corpus(configuration, tmp_path)
    assert not unexplained, f"{configuration}: undeclared differences from Kafka:\n" + (
        "\n".join(unexplained)
    )
    unlike = [
        f"{case} / {step}: {BASELINE} {theirs.hex()[:160]} | {configuration} {ours.hex()[:160]}"
        for case, steps in baseline.items()
        for (step, theirs), (_, ours) in zip(steps, wires[case], strict=True)
        if theirs != ours
    ]
    assert not unlike, f"{configuration} answers otherwise than {BASELINE}:\n" + "\n".join(unlike)


def test_the_baseline_received_every_answer(baseline: Answers) -> None:
    # What is compared is there: every step Kafka answers has pidctl's answer's bytes.
    closed = {
        (case.name, step["step"])
        for case in CASES
        for step in read_golden(case)["steps"]
        if step["answer"] == {"closed": True}
    }
    for case, steps in baseline.items():
        for step, data in steps:
            assert data or (case, step) in closed, (case, step)
