"""How pidctl's wheel is built (everything else is in pyproject.toml).

On Linux x86-64 with CPython the wheel carries the request path compiled by mypyc beside its
sources, as black ships its wheels: the same modules ``python -m ops.compiled`` builds for
the tests, the benchmarks and the Docker image (``ops/compiled.py`` says which and why),
which Python imports instead of the sources. Anywhere else the wheel is pure Python and runs
the same sources interpreted. ``PIDCTL_COMPILE=0`` builds the pure wheel here too;
``PIDCTL_COMPILE=1`` insists on compiling (a failed compile fails the build either way on
Linux x86-64: a wheel must not silently be the slower build). An editable install
(``pip install -e .``) never compiles.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent


def compiling() -> bool:
    """Whether this build compiles the request path (see the module's docstring)."""
    wanted = os.environ.get("PIDCTL_COMPILE", "auto")
    if wanted not in ("0", "1", "auto"):
        sys.exit(f"PIDCTL_COMPILE={wanted}: expected 0, 1 or auto")
    if wanted != "auto":
        return wanted == "1"
    return sysconfig.get_platform() == "linux-x86_64" and sys.implementation.name == "cpython"


class BuildPyWithCompiled(build_py):
    """The sources as usual, then mypyc's extension modules beside them (and the two
    libraries of their groups at the top of the wheel, where the extensions load them)."""

    def run(self) -> None:
        super().run()
        if not compiling() or getattr(self, "editable_mode", False):
            return
        sys.path.insert(0, str(ROOT))
        from ops import compiled

        with tempfile.TemporaryDirectory(prefix="pidctl-compiled-") as tree:
            compiled.build(Path(tree))
            suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
            built = [p for p in Path(tree).rglob("*") if p.name.endswith(suffixes)]
            if not built:
                raise RuntimeError("mypyc built no extension modules")
            for path in built:
                target = Path(self.build_lib) / path.relative_to(tree)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)


class MaybeBinaryDistribution(Distribution):
    """A compiled wheel is tagged for its Python and platform (cp311-cp311-linux_x86_64);
    a pure one is py3-none-any."""

    def has_ext_modules(self) -> bool:
        return compiling()


setup(cmdclass={"build_py": BuildPyWithCompiled}, distclass=MaybeBinaryDistribution)
