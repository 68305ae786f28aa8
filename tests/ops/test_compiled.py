"""The compiled build (ops/compiled.py): that the suite runs the build it says it runs, the
rules mypyc's compilation needs of the source, and which built trees are kept."""

from __future__ import annotations

import ast
import collections
import importlib
import importlib.machinery
import importlib.util
import os
import re
from pathlib import Path

from ops import compiled


def _module_name(path: str) -> str:
    name = compiled._tree_name(path).removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def test_the_suite_imports_the_build_it_runs() -> None:
    """``ops/dev.sh test`` runs the suite on the compiled build (TEST_BUILD=compiled, the tree
    first on PYTHONPATH): every module listed is then an extension module, so every test of
    it tests what ships. Run otherwise, every one is its source."""
    expect_compiled = os.environ.get("TEST_BUILD") == "compiled"
    sources = compiled.compiled_sources()
    assert len(sources) > 40
    for path in sources:
        module = importlib.import_module(_module_name(path))
        file = module.__file__ or ""
        is_extension = file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
        assert is_extension == expect_compiled, f"{module.__name__}: {file}"
    for path in compiled.INTERPRETED:
        assert (importlib.import_module(_module_name(path)).__file__ or "").endswith(".py")
    # The groups' shared libraries, which the extension modules load, are at the tree's top.
    for group in compiled.GROUPS:
        found = importlib.util.find_spec(f"{group}__mypyc") is not None
        assert found == expect_compiled, group


def test_pidctl_version_names_the_build_that_runs() -> None:
    """``pidctl --version`` (and the first log line, and ``pidctl_build_info``) say which
    build runs: the request path compiled by mypyc, or interpreted."""
    from pidctl.controller.cli import version_line
    from pidctl.protocol import __version__

    line = version_line()
    assert line.startswith(f"pidctl {__version__} (")
    assert ("compiled by mypyc" in line) == (os.environ.get("TEST_BUILD") == "compiled"), line
    assert ("interpreted" in line) == (os.environ.get("TEST_BUILD") != "compiled"), line


def test_every_compiled_folder_is_in_one_group() -> None:
    """A folder in two groups would be compiled twice, into two libraries (what is compiled
    is the groups' folders, :data:`compiled.COMPILED` only lists them)."""
    assert len(compiled.COMPILED) == len(set(compiled.COMPILED))
    grouped = [compiled._group_sources(folders) for folders in compiled.GROUPS.values()]
    assert all(len(sources) > 10 for sources in grouped)  # halves, not a module apart


def test_an_exception_name_has_one_type_per_function() -> None:
    """Compiled, a local name has one type in its whole function: ``except A as e`` and
    ``except B as e`` in one function make raising B a TypeError at run time (mypy allows
    it: it types each clause's name apart)."""
    problems = []
    for path in compiled.compiled_sources():
        tree = ast.parse((compiled.ROOT / path).read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            types = collections.defaultdict(set)
            for node in ast.walk(function):
                if isinstance(node, ast.ExceptHandler) and node.name and node.type:
                    types[node.name].add(ast.unparse(node.type))
            problems += [
                f"{path}:{function.lineno} {function.name}: {name} is {' and '.join(sorted(t))}"
                for name, t in types.items()
                if len(t) > 1
            ]
    assert problems == []


#: A type alias's name (``Timings``): CamelCase, a type, not a value read at run time.
_TYPE_ALIAS = re.compile(r"_?[A-Z][a-z0-9]+[A-Za-z0-9]*")


def _bound_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Tuple):
        return [name for element in target.elts for name in _bound_names(element)]
    return [target.id] if isinstance(target, ast.Name) else []


def test_every_compiled_module_value_is_final() -> None:
    """Compiled, a module-level value (a constant, a logger, a bound reader) that is not
    ``Final`` is looked up by name in its module's dict on every read (and an imported
    one in the importer's); a ``Final`` one is a C static, an int or string literal
    inlined. The request path reads dozens a request (ARCHITECTURE.md, the compiled
    build's rules). Type aliases and type variables are no values read at run time."""
    problems = []
    for path in compiled.compiled_sources():
        tree = ast.parse((compiled.ROOT / path).read_text())
        for node in tree.body:
            if isinstance(node, ast.AnnAssign):
                if node.value is None or "Final" in ast.unparse(node.annotation):
                    continue
                names = _bound_names(node.target)
            elif isinstance(node, ast.Assign):
                if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "TypeVar":
                    continue
                names = [name for target in node.targets for name in _bound_names(target)]
            else:
                continue
            problems += [
                f"{path}:{node.lineno} {name}"
                for name in names
                if name != "__all__" and not _TYPE_ALIAS.fullmatch(name)
            ]
    assert problems == []


def test_no_compiled_exception_has_a_property() -> None:
    """Compiled, reading a property of a caught exception crashed the server (SIGSEGV in
    the log's roll, under EMFILE): an exception carries plain attributes, and what is
    derived from them is a function (ARCHITECTURE.md, the compiled build's rules)."""
    trees = [
        (path, ast.parse((compiled.ROOT / path).read_text()))
        for path in compiled.compiled_sources()
    ]
    exceptions = {"BaseException", "Exception", "OSError", "RuntimeError", "ValueError"}
    grown = True
    while grown:  # (subclasses of subclasses, across modules)
        grown = False
        for _, tree in trees:
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.ClassDef)
                    and node.name not in exceptions
                    and any(ast.unparse(base).split(".")[-1] in exceptions for base in node.bases)
                ):
                    exceptions.add(node.name)
                    grown = True
    problems = [
        f"{path}:{method.lineno} {node.name}.{method.name}"
        for path, tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name in exceptions
        for method in node.body
        if isinstance(method, ast.FunctionDef)
        and any("property" in ast.unparse(d) for d in method.decorator_list)
    ]
    assert "PidctlError" in exceptions and "StorageFailed" in exceptions
    assert problems == []


def test_every_compiled_module_is_shipped_and_named_as_installed() -> None:
    assert _module_name("controller/core/blocks.py") == "pidctl.controller.core.blocks"
    assert _module_name("protocol/__init__.py") == "pidctl.protocol"
    for path in compiled.compiled_sources():
        assert (compiled.ROOT / path).is_file()
        assert _module_name(path).startswith("pidctl.")


def test_only_the_newest_trees_are_kept(tmp_path: Path) -> None:
    """Each changed checkout builds a tree of its own: the newest and ``KEEP_EARLIER``
    earlier ones stay (a run still going may start servers from one), older ones go."""
    for age in range(5):  # compiled-0 the newest
        tree = tmp_path / f"compiled-{age}"
        (tree / "pidctl").mkdir(parents=True)
        os.utime(tree, (1_000_000 - age, 1_000_000 - age))
    (tmp_path / "other").mkdir()  # not a tree: left alone
    removed = compiled.prune(tmp_path, keep=2)
    assert sorted(path.name for path in removed) == ["compiled-3", "compiled-4"]
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "compiled-0",
        "compiled-1",
        "compiled-2",
        "other",
    ]
    assert compiled.prune(tmp_path, keep=2) == []
