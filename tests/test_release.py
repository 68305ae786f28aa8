"""A release as the README makes and installs it: ``python -m build`` gives an sdist and a
wheel that, on Linux x86-64, carries the request path compiled by mypyc beside its sources
(pure Python elsewhere); the wheel installed in a fresh venv says which build it is and
serves compiled; the Dockerfile installs that same wheel. One build serves the module (it
compiles: minutes of CPU), in a copy of the checkout (a build writes build/ and
*.egg-info/ where it runs)."""

from __future__ import annotations

import importlib.machinery
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka
import pytest

from ops import compiled
from ops.testing.coordination import free_port
from ops.testing.serverproc import wait_until
from pidctl.client import SyncClient
from pidctl.protocol import __version__, requests
from tests import docs

ROOT = docs.ROOT
INSTALL = ("README.md", "Install", 0)
COMPILES_HERE = sysconfig.get_platform() == "linux-x86_64" and sys.implementation.name == "cpython"
EXTENSION = tuple(importlib.machinery.EXTENSION_SUFFIXES)
#: What a copy of the checkout leaves out: what .gitignore does, and git's own files.
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache",
    ".hypothesis", "build", "dist", "*.egg-info", "pidctl-data", "results", ".build",
)  # fmt: skip

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Release:
    checkout: Path
    sdist: Path
    wheel: Path
    venv: Path  # where the README's install put it


#: The environment the installed release runs in, as a user's shell has it: without the test
#: run's PYTHONPATH (``ops/dev.sh test`` puts the compiled build's directory there, which
#: would shadow the wheel's own modules) and its TEST_BUILD.
INSTALLED_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TEST_BUILD")}


def _shell(command: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={
            **INSTALLED_ENV,
            **(env or {}),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        },
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-4000:])
    return done.stdout


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The README's install block as written, in a copy of the checkout, its venv's path
    moved into the test's folder; ``python`` is the test venv's (which has ``build``)."""
    base = tmp_path_factory.mktemp("release")
    checkout = base / "checkout"
    shutil.copytree(ROOT, checkout, ignore=NOT_SOURCES)
    venv = base / "opt-pidctl"
    lines = docs.commands(docs.moved(docs.block(*INSTALL), {"/opt/pidctl": str(venv)}))
    for line in lines:
        _shell(line, checkout)
    (sdist,) = (checkout / "dist").glob("pidctl-*.tar.gz")
    (wheel,) = (checkout / "dist").glob("pidctl-*.whl")
    return Release(checkout, sdist, wheel, venv)


def test_the_wheel_carries_the_compiled_modules_beside_their_sources(release: Release) -> None:
    """Every module the compiled build lists, as its source and (on Linux x86-64) its
    extension module; the groups' libraries at the top; no test harness or benchmark."""
    names = zipfile.ZipFile(release.wheel).namelist()
    tag = "cp311-cp311-linux_x86_64" if COMPILES_HERE else "py3-none-any"
    assert release.wheel.name == f"pidctl-{__version__}-{tag}.whl"
    for path in compiled.compiled_sources():
        source = compiled._tree_name(path)
        assert source in names, source
        stem = source.removesuffix(".py")
        extensions = [n for n in names if n.startswith(stem + ".") and n.endswith(EXTENSION)]
        assert len(extensions) == (1 if COMPILES_HERE else 0), (source, extensions)
    for group in compiled.GROUPS:
        assert any(n.startswith(f"{group}__mypyc.") for n in names) == COMPILES_HERE
    for path in compiled.INTERPRETED:
        stem = compiled._tree_name(path).removesuffix(".py")
        assert not [n for n in names if n.startswith(stem + ".") and n.endswith(EXTENSION)]
    assert not [n for n in names if n.startswith(("ops/", "tests/", "pidctl/testing"))]
    sdist = subprocess.run(["tar", "tzf", release.sdist], capture_output=True, text=True)
    members = {name.split("/", 1)[1] for name in sdist.stdout.split()}
    assert {"setup.py", "ops/compiled.py", "pyproject.toml"} <= members
    assert not [m for m in members if m.startswith(("tests/", "ops/testing/", "ops/bench/"))]


def test_the_installed_wheel_says_which_build_it_is(release: Release) -> None:
    """`pidctl --version` of the README's install prints what the block's comment says: the
    version and, on Linux x86-64, the compiled build."""
    text = docs.block(*INSTALL)
    [said] = re.findall(r"pidctl --version +# (.*)", text)
    version = subprocess.run(
        [release.venv / "bin" / "pidctl", "--version"],
        capture_output=True,
        text=True,
        env=INSTALLED_ENV,
    )
    assert version.returncode == 0, version.stderr
    # The comment names this release's version and build; the Python's version varies.
    assert said.split("; ")[0] == version.stdout.strip().split("; ")[0]
    assert said.startswith(f"pidctl {__version__} (compiled by mypyc; CPython ")
    if not COMPILES_HERE:
        assert "(interpreted;" in version.stdout


def test_the_request_path_runs_compiled_from_the_wheel(release: Release, tmp_path: Path) -> None:
    """The wheel's own `pidctl` formats and serves: the first log line and pidctl_build_info
    say compiled, the modules a request passes through are extension modules, and a real
    request is answered."""
    pidctl = release.venv / "bin" / "pidctl"
    expected = "compiled" if COMPILES_HERE else "interpreted"
    imported = subprocess.run(
        [
            release.venv / "bin" / "python",
            "-c",
            "import pidctl.protocol.server as s, pidctl.controller.api.handlers as h;"
            "print(s.__file__); print(h.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=INSTALLED_ENV,
    ).stdout.split()
    assert all(str(release.venv) in f and f.endswith(EXTENSION) == COMPILES_HERE for f in imported)
    data_dir = tmp_path / "data"
    subprocess.run(
        [pidctl, "format", "--data-dir", data_dir],
        check=True,
        capture_output=True,
        env=INSTALLED_ENV,
    )
    port, metrics = free_port(), free_port()
    log = tmp_path / "serve.log"
    with log.open("w") as sink:
        server = subprocess.Popen(
            [pidctl, "serve", "--data-dir", data_dir, "--listen", f"127.0.0.1:{port}",
             "--metrics-listen", f"127.0.0.1:{metrics}", "--log-format", "json"],
            stderr=sink,
            env=INSTALLED_ENV,
        )  # fmt: skip
    try:

        def events() -> list[dict[str, object]]:
            return [json.loads(line) for line in log.read_text().splitlines() if line]

        wait_until(lambda: any(e["event"] == "listening" for e in events()), "the wheel's server")
        first = events()[0]
        assert (first["event"], first["build"], first["version"]) == (
            "pidctl starting",
            expected,
            __version__,
        )
        with SyncClient(f"127.0.0.1:{port}") as client:
            answer = client.request(requests.init_producer_id())
        assert (answer.error_code, answer.producer_epoch) == (0, 0)
        # A real client too: librdkafka's transactional producer finds its coordinator
        # (the advertised address) and gets its producer id; it raises if it cannot.
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": "from-the-wheel"}
        )
        producer.init_transactions(60)
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10) as page:
            exposed = page.read().decode()
        assert re.search(rf'pidctl_build_info\{{build="{expected}",.*\}} 1\.0', exposed)
    finally:
        server.terminate()
        assert server.wait(30) == 0


def test_elsewhere_the_wheel_is_pure_python(release: Release, tmp_path: Path) -> None:
    """What another platform gets (PIDCTL_COMPILE=0 builds it here): a py3-none-any wheel
    with no extension module, whose pidctl says it runs interpreted."""
    out = tmp_path / "pure"
    _shell(f"python -m build --wheel --outdir {out}", release.checkout, {"PIDCTL_COMPILE": "0"})
    (wheel,) = out.glob("*.whl")
    assert wheel.name == f"pidctl-{__version__}-py3-none-any.whl"
    assert not [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(EXTENSION)]
    venv = tmp_path / "venv"
    _shell(f"python -m venv --without-pip {venv}", tmp_path)
    _shell(
        f"python -m pip --python {venv}/bin/python install --no-deps --no-index {wheel}", tmp_path
    )
    purelib = subprocess.run(
        [
            venv / "bin" / "python",
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=INSTALLED_ENV,
    ).stdout.strip()
    # pidctl's dependencies from the test venv (a .pth line runs no .pth file of that folder,
    # so not its editable pidctl).
    (Path(purelib) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    version = _shell(f"{venv}/bin/pidctl --version", tmp_path)
    assert version.startswith(f"pidctl {__version__} (interpreted; ")


def test_the_dockerfile_installs_that_wheel() -> None:
    """The image's build stage makes the wheel as the README does (python -m build) from what
    the sdist holds; the image installs that wheel and copies no source folder."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stages = re.split(r"^FROM ", text, flags=re.M)[1:]
    assert [stage.split()[0] for stage in stages] == ["python:3.11-slim"] * 2
    build, image = stages
    assert re.search(r"^RUN .*python -m build --wheel --outdir /dist$", build, re.M)
    copied = re.findall(r"^COPY (.*) \./?\S*$", build, re.M)
    assert "pyproject.toml setup.py MANIFEST.in README.md LICENSE" in copied
    assert re.findall(r"^COPY (.*)$", image, re.M) == ["--from=wheel /dist/ /tmp/dist/"]
    assert re.search(r"^RUN pip install /tmp/dist/pidctl-\*\.whl ", image, re.M)


def test_the_build_requirements_follow_the_dependencies() -> None:
    """setup.py's compile type-checks the sources against pidctl's dependencies: the build
    requirements name each, at the same versions, and the compile extra's mypy."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["compile"],
    }
    marker = "sys_platform == 'linux' and platform_machine == 'x86_64'"
    requires = project["build-system"]["requires"]
    compiled_only = {r.split(";")[0].strip() for r in requires if marker in r}
    assert compiled_only == needed
