"""Size as a stated goal: the shipped lines, and the largest classes.

    python -m ops.size [--top N] [--check]

prints the lines of every shipped package (what ``pyproject.toml`` maps under ``pidctl``),
their total, and the ``N`` largest classes (20 by default) with their lines and whether
they are on the request path (the rooms compiled by mypyc, ``ops/compiled.py``'s
``COMPILED``: a request passes through them). CI prints it (``ops/dev.sh test``).

``--check`` fails (exit 1) if a request-path class is longer than
:data:`MAX_REQUEST_PATH_CLASS_LINES`: a big class is split by concern into small rooms,
never grown. ``tests/ops/test_size.py`` runs the check.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ops.compiled import COMPILED, PACKAGES, ROOT

#: The goal: no class a request passes through is longer than this many lines.
MAX_REQUEST_PATH_CLASS_LINES = 300


@dataclass(frozen=True, slots=True)
class ClassSize:
    """A class's place (``path:Name``, nested classes as ``Outer.Inner``) and lines."""

    name: str
    lines: int
    request_path: bool


def shipped_files() -> Iterator[Path]:
    """Every ``.py`` file of the shipped packages."""
    for folder in sorted(set(PACKAGES.values())):
        yield from sorted((ROOT / folder).rglob("*.py"))


def _on_request_path(relative: str) -> bool:
    folder = relative.rsplit("/", 1)[0]
    return folder in COMPILED


def class_sizes(path: Path) -> list[ClassSize]:
    """The classes of ``path``, each with its lines (decorators included)."""
    relative = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(), str(path))
    sizes = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                lines = (child.end_lineno or child.lineno) - first + 1
                name = f"{prefix}{child.name}"
                sizes.append(ClassSize(f"{relative}:{name}", lines, _on_request_path(relative)))
                visit(child, f"{name}.")

    visit(tree, "")
    return sizes


def over_the_goal(sizes: list[ClassSize]) -> list[str]:
    """What ``--check`` refuses: each request-path class above the goal."""
    return [
        f"{size.name}: {size.lines} lines, over {MAX_REQUEST_PATH_CLASS_LINES}"
        for size in sizes
        if size.request_path and size.lines > MAX_REQUEST_PATH_CLASS_LINES
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=20, help="classes listed (default 20)")
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"fail if a request-path class is over {MAX_REQUEST_PATH_CLASS_LINES} lines",
    )
    args = parser.parse_args(argv)
    by_package: dict[str, int] = {}
    sizes: list[ClassSize] = []
    for path in shipped_files():
        relative = path.relative_to(ROOT).as_posix()
        package = next(
            name for name, folder in PACKAGES.items() if relative.startswith(folder + "/")
        )
        by_package[package] = by_package.get(package, 0) + len(path.read_text().splitlines())
        sizes += class_sizes(path)
    print("shipped lines (pidctl.*):")
    for package, lines in sorted(by_package.items()):
        print(f"  {package:<24} {lines:>7,}")
    print(f"  {'total':<24} {sum(by_package.values()):>7,}")
    print(f"largest classes ({args.top}; * on the request path):")
    for size in sorted(sizes, key=lambda s: -s.lines)[: args.top]:
        print(f"  {size.lines:>5} {'*' if size.request_path else ' '} {size.name}")
    problems = over_the_goal(sizes)
    if problems and args.check:
        print("over the goal:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
