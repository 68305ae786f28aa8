"""pidctl compiled: its request path's modules compiled to C extensions by mypyc.

    python -m ops.compiled [--into DIR]

prints the directory of a complete pidctl package tree (every ``.py`` file of what ships,
and beside the modules listed in :data:`COMPILED` their extension modules, which Python
imports instead): put it first on ``PYTHONPATH`` and ``pidctl`` is the compiled build. The
source stays the only truth: the same typed Python, which mypy already checks strictly, is
what mypyc compiles, and an installed pidctl without the extensions runs it as it is.

Why: the benchmarks (issue 34) put each request's cost in Python's interpretation of our own
code (dispatch, attribute lookups, the objects of every step): compiled, a request costs
30-45 % fewer instructions (docs/design-decisions.md). It is built from the checkout by
the tests (``ops/dev.sh test``), the benchmarks and the Docker image, so what is tested and
measured is what ships.

Without ``--into`` the tree is built under ``build/compiled-<hash>/`` (ignored by git), the
hash taken over every shipped source file, the groups' modules, mypyc's version and the
interpreter: an unchanged checkout reuses it, a changed one is built again (two minutes
on two cores, :data:`GROUPS` says why; the oldest trees are removed, :data:`KEEP_EARLIER`
earlier ones kept).
``--into DIR`` builds into DIR (the Docker image's build stage). It needs a
C compiler and the mypy the ``compile`` extra pins (the ``test`` extra installs it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

#: The shipped packages: the name under ``pidctl`` and the folder in the checkout, read from
#: pyproject.toml's package-dir (the one place that maps them).
PACKAGES = {
    name.removeprefix("pidctl."): folder
    for name, folder in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].items()
}

#: The folders whose modules are compiled: everything a request goes through, from the
#: socket to the log and back. The command line, settings, the fleet, SASL and the client
#: libraries run at start-up or rarely, and stay interpreted.
#:
#: They are compiled in two groups, each one C file and one shared library, by two C
#: compilers at once: the single file of one group took four minutes of one core, nearly
#: all of the build, and two halves take two on two cores. A call from one group into the
#: other goes through a table and is never inlined; the split (the decisions, the log and
#: the metrics; the wire and the server around them) cost a transactional InitProducerId
#: 0.6 % more instructions (the compiled code's share 8.8 % -> 9.4 %), well inside the
#: spread of instructions per request (docs/design-decisions.md).
GROUPS = {
    "pidctl_state": ("controller/core", "controller/log", "controller/server/telemetry"),
    "pidctl_wire": (
        "protocol",
        "controller/api",
        "controller/server",
        "controller/server/transport",
    ),
}
COMPILED = tuple(folder for folders in GROUPS.values() for folder in folders)

#: Modules of those folders mypyc cannot compile correctly (mypy 2.4), interpreted:
#: - telemetry/logs.py: one assignment to several names in a class body (structlog's
#:   logger methods, all ``msg``) is not supported.
INTERPRETED = ("controller/server/telemetry/logs.py",)


class BuildFailed(RuntimeError):
    """mypyc refused the sources (what it said is the message)."""


def _group_sources(folders: tuple[str, ...]) -> list[str]:
    paths = []
    for folder in folders:
        for path in sorted((ROOT / folder).glob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative not in INTERPRETED:
                paths.append(relative)
    return paths


def compiled_sources() -> list[str]:
    """The checkout's paths of the modules compiled, relative to the root."""
    return _group_sources(COMPILED)


def _shipped_files() -> list[Path]:
    return sorted(
        path
        for folder in PACKAGES.values()
        for path in (ROOT / folder).rglob("*")
        # .java: pidctl-kafka's carrier, shipped as sources (package data, pyproject.toml)
        if path.suffix in (".py", ".typed", ".java") and "__pycache__" not in path.parts
    )


def _digest() -> str:
    import mypy.version

    h = hashlib.sha256()
    h.update(f"{mypy.version.__version__} {sys.version} {sysconfig.get_platform()}\n".encode())
    for name, folders in GROUPS.items():
        h.update(f"{name}: {' '.join(_group_sources(folders))}\n".encode())
    for path in _shipped_files():
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _tree_name(checkout_path: str) -> str:
    """Where a checkout path goes in the package tree (``controller/x.py`` ->
    ``pidctl/controller/x.py``)."""
    for name, folder in PACKAGES.items():
        if checkout_path == folder or checkout_path.startswith(folder + "/"):
            return f"pidctl/{name}{checkout_path[len(folder) :]}"
    raise ValueError(f"{checkout_path} is not in a shipped package")


def source_file(module: ModuleType) -> Path:
    """The ``.py`` file of an imported pidctl module, compiled or not: an extension module
    (``blocks.cpython-311-x86_64-linux-gnu.so``) has its source beside it in the tree, which
    is what reads its code (a compiled function has none to inspect)."""
    file = Path(module.__file__ or "")
    return file.with_name(file.name.split(".")[0] + ".py")


#: What ``python -m mypyc`` runs (a setup script over ``mypycify``), with the groups and
#: ``build_ext --parallel``, which compiles the groups' extensions at once.
_SETUP = """
import json, sys
from mypyc.build import mypycify
from setuptools import setup

paths, groups = json.loads(sys.argv[1])
setup(
    name="pidctl-compiled",
    ext_modules=mypycify(paths, separate=[(sources, name) for sources, name in groups]),
    script_args=["build_ext", "--inplace", "--parallel", sys.argv[2]],
)
"""


def build(into: Path) -> None:
    """Copy the shipped packages into ``into/pidctl`` and compile :data:`COMPILED` there."""
    for path in _shipped_files():
        target = into / _tree_name(path.relative_to(ROOT).as_posix())
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    groups = [
        ([_tree_name(path) for path in _group_sources(folders)], name)
        for name, folders in GROUPS.items()
    ]
    paths = ["--config-file", str(ROOT / "pyproject.toml")]
    paths += [source for sources, _ in groups for source in sources]
    # mypyc builds in the tree: each extension beside its module, the groups' libraries at
    # the top (where the tree's directory on sys.path finds them).
    result = subprocess.run(
        [sys.executable, "-c", _SETUP, json.dumps([paths, groups]), str(len(groups))],
        cwd=into,
        env={**os.environ, "MYPYPATH": str(into)},
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise BuildFailed(f"mypyc failed:\n{result.stdout[-4000:]}{result.stderr[-4000:]}")
    shutil.rmtree(into / "build")  # its C sources and objects
    shutil.rmtree(into / ".mypy_cache", ignore_errors=True)


#: Trees of earlier checkouts kept besides the newest (9 MB each): a benchmark or a test run
#: still going may be starting servers from one.
KEEP_EARLIER = 2


def prune(parent: Path, keep: int = KEEP_EARLIER) -> list[Path]:
    """Remove all but the ``keep`` newest earlier trees in ``parent`` (by the time they were
    built) besides the newest; what was removed."""
    trees = sorted(parent.glob("compiled-*"), key=lambda tree: tree.stat().st_mtime)
    removed = trees[: max(0, len(trees) - 1 - keep)]
    for tree in removed:
        shutil.rmtree(tree, ignore_errors=True)
    return removed


def tree() -> Path:
    """The compiled build of this checkout, built now unless built already (and then the
    oldest earlier ones removed: :func:`prune`)."""
    path = ROOT / "build" / f"compiled-{_digest()}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # Built under a temporary name, then renamed: two builds at once never leave a half
        # tree under the final name.
        temporary = Path(tempfile.mkdtemp(dir=path.parent, prefix=".compiled-"))
        try:
            build(temporary)
            temporary.rename(path)
        except OSError:
            if not path.exists():
                raise
        finally:
            shutil.rmtree(temporary, ignore_errors=True)
        prune(path.parent)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ops.compiled", description=__doc__)
    parser.add_argument("--into", type=Path, help="build here (default: build/compiled-HASH)")
    args = parser.parse_args()
    try:
        if args.into is not None:
            args.into.mkdir(parents=True, exist_ok=True)
            build(args.into)
            print(args.into)
        else:
            print(tree())
    except BuildFailed as e:
        sys.exit(str(e))


if __name__ == "__main__":
    main()
