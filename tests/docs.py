"""The fenced code blocks of the README and docs/, for the tests that run them as written."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Every Markdown file whose blocks must be run by a test, or said why not (tests/test_docs.py).
DOCUMENTS = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))

#: pidctl's default ports (DESIGN.md §2): where the user's own server listens.
_DEFAULT_PORT = re.compile(r":(9093|9464)\b")
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```$", re.S | re.M)
_HEADING = re.compile(r"^#{1,6} (.*)$", re.M)


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is (file, the heading above it, its number under that
    heading from 0), its language and its text."""

    document: str
    section: str
    index: int
    language: str
    text: str

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.document, self.section, self.index)


def blocks(document: str) -> list[Block]:
    """The fenced blocks of ``document`` (a path relative to the checkout), in order."""
    text = (ROOT / document).read_text()
    fences = list(_FENCE.finditer(text))
    headings = [
        (m.start(), m.group(1).strip())
        for m in _HEADING.finditer(text)
        if not any(f.start() < m.start() < f.end() for f in fences)  # a shell comment
    ]
    found: list[Block] = []
    counts: dict[str, int] = {}
    for match in fences:
        above = [title for at, title in headings if at < match.start()]
        section = above[-1] if above else ""
        index = counts.get(section, 0)
        counts[section] = index + 1
        body = "\n".join(line[len(match.group(1)) :] for line in match.group(3).splitlines())
        found.append(Block(document, section, index, match.group(2), body + "\n"))
    return found


def block(document: str, section: str, index: int = 0) -> str:
    """The text of one block, by its place."""
    for candidate in blocks(document):
        if candidate.key == (document, section, index):
            return candidate.text
    raise KeyError((document, section, index))


def commands(text: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blank lines out."""
    joined = text.replace("\\\n", " ")
    lines = [line.split(" #")[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def moved(text: str, moves: Mapping[str, str]) -> str:
    """``text`` (a block, or a command of one) with each written address or path replaced by
    the test's own; no default port of pidctl's may be left in it, so that a block run as
    written cannot talk to a server the test did not start (the user's own, beside the
    suite)."""
    for written, ours in moves.items():
        text = text.replace(written, ours)
    left = sorted({m.group(0) for m in _DEFAULT_PORT.finditer(text)})
    assert not left, f"a default port is left in a block the test runs: {left}\n{text}"
    return text
