"""The fenced code blocks of the README and docs/, for the tests that run them as written."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
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


#: The user documents: what a user reads. They carry no commit hash, issue number, notes of a
#: working session or dates of runs (tests/test_docs.py): those are git's.
USER_DOCUMENTS = (*DOCUMENTS, "CHANGELOG.md", "CONTRIBUTING.md")

_HEX = re.compile(r"(?<![\w./-])[0-9a-f]{7,40}(?![\w/-])")
_NOTES = (
    re.compile(r"\b(?:issues?|PR|pull request) ?#?\d+\b", re.I),
    re.compile(r"(?<![\w&/(])#\d+\b"),
    re.compile(
        r"\b(?:this|that|last|next|previous|earlier|working|(?:fir|seco|thi|four|fif|six|seven|"
        r"eigh|nin|ten|eleven|twelf)\w*) session\b",
        re.I,
    ),
    re.compile(r"\b(?:slow|fast|busy|quiet|slower|faster) hour\b", re.I),
    re.compile(r"\b(?:this|the last|the next) round\b|\bround before\b", re.I),
    re.compile(r"\bhelpers?\b.{0,40}\b(?:ran|running|suites?|valgrind)\b|\bthe lead\b", re.I),
    # A day, not a timestamp's, nor a release's in a changelog heading ("## [1.0.0] - DAY").
    re.compile(r"(?<![\w'-])(?<!\] - )20\d\d-[01]\d-[0-3]\d(?![T\d])"),
)


def working_notes(text: str, is_commit: Callable[[str], bool]) -> list[str]:
    """What in ``text`` is a commit hash (a hex word of 7 or more characters with a digit
    and a letter, or one ``is_commit`` knows), an issue number, a working session's word or
    a run's date."""
    found = []
    for match in _HEX.finditer(text):
        word = match.group(0)
        mixed = any(c.isdigit() for c in word) and any(c.isalpha() for c in word)
        if mixed or is_commit(word):
            found.append(word)
    for pattern in _NOTES:
        found += [m.group(0) for m in pattern.finditer(text)]
    return found


_SPAN = re.compile(r"`([^`\n]+)`")
_COMMAND = re.compile(r"(?:^|[\s/(])pidctl((?:\s+[a-z][\w-]*)+)([^|;&`\n]*)")


def pidctl_commands(document: str) -> list[tuple[list[str], list[str]]]:
    """Every ``pidctl`` command named in ``document``, in a code span or a shell block: its
    leading words (the command and any subcommand, and maybe words that follow) and the
    ``--flags`` it names."""
    text = (ROOT / document).read_text()
    sources = [m.group(1) for m in _SPAN.finditer(text)]
    sources += [line for b in blocks(document) if b.language == "sh" for line in commands(b.text)]
    found = []
    for source in sources:
        for match in _COMMAND.finditer(source):
            words = match.group(1).split()
            rest = match.group(1) + match.group(2)
            found.append((words, re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest)))
    return found
