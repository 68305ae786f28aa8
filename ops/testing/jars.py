"""Java libraries the tests run (Apache Kafka's broker and client), fetched from Maven Central.

Each set is a throwaway POM in ``ops/testing/maven/`` whose dependency list Maven resolves;
the jars stay in Maven's own cache (``~/.m2``), and the resolved class path is kept in
``~/.cache/pidctl-dev/`` under the POM's digest, so a second run asks Maven nothing.
Nothing is built and no jar enters the repository.

    python -m ops.testing.jars [SET ...]     fetch the sets (all by default); ops/dev.sh runs it
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ops.testing.java import require_java

MAVEN_DIR = Path(__file__).parent / "maven"
#: What ``python -m ops.testing.jars`` fetches without arguments: every POM here.
SETS = tuple(sorted(path.stem for path in MAVEN_DIR.glob("*.xml")))
#: The version of Maven's dependency plugin that resolves the sets.
DEPENDENCY_PLUGIN = "3.7.0"
#: How long one Maven resolution may take (a first fetch of Kafka is ~100 MB).
FETCH_TIMEOUT_S = 900
#: Words in Maven's output that mean the repository could not be reached.
UNREACHABLE = (
    "Could not transfer",
    "Unknown host",
    "Connection refused",
    "Network is unreachable",
    "timed out",
    "Connect to",
)
HOW_TO_FETCH = "run `ops/dev.sh fetch` (or `.venv/bin/python -m ops.testing.jars`)"


class JarsMissing(RuntimeError):
    """A set of jars is not fetched, or could not be: the message says what to do."""


def cache_dir() -> Path:
    """Where resolved class paths are kept: ``$XDG_CACHE_HOME/pidctl-dev`` (``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pidctl-dev"


def _pom(name: str) -> Path:
    pom = MAVEN_DIR / f"{name}.xml"
    if not pom.is_file():
        raise ValueError(f"no jar set {name!r}; known: {', '.join(SETS)}")
    return pom


def _classpath_file(name: str) -> Path:
    digest = hashlib.sha256(_pom(name).read_bytes()).hexdigest()[:16]
    return cache_dir() / f"{name}-{digest}.classpath"


def _read(path: Path) -> str | None:
    """The class path kept in ``path``, if every jar it names is still there."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    if not text or not all(Path(jar).is_file() for jar in text.split(os.pathsep)):
        return None
    return text


def classpath(name: str) -> str:
    """The class path of set ``name`` (``kafka``), fetched earlier; raises JarsMissing with
    the command that fetches it."""
    text = _read(_classpath_file(name))
    if text is None:
        raise JarsMissing(f"the {name} jars are not fetched: {HOW_TO_FETCH}")
    return text


def fetch(name: str, maven: str = "mvn", maven_args: Sequence[str] = ()) -> str:
    """Resolve set ``name`` with Maven (downloading what ``~/.m2`` lacks) and keep its class
    path; returns it. A set already fetched costs nothing. ``maven_args`` go to Maven
    (``-s settings.xml``, ``-Dmaven.repo.local=…``)."""
    target = _classpath_file(name)
    kept = _read(target)
    if kept is not None:
        return kept
    require_java()
    if shutil.which(maven) is None:
        raise JarsMissing(f"Maven ({maven}) is not installed: Debian: apt-get install maven")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    command = [
        maven,
        "--batch-mode",
        *maven_args,
        "--file",
        str(_pom(name)),
        # The plugin by its full name: resolving it is itself a download, so an unreachable
        # repository shows as one rather than as "no plugin found for prefix".
        f"org.apache.maven.plugins:maven-dependency-plugin:{DEPENDENCY_PLUGIN}:build-classpath",
        f"-Dmdep.outputFile={partial}",
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise JarsMissing(
            f"fetching the {name} jars from Maven Central took over {FETCH_TIMEOUT_S} s"
        ) from None
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        tail = "\n".join(output.splitlines()[-8:])
        if any(word in output for word in UNREACHABLE):
            raise JarsMissing(
                f"could not fetch the {name} jars: Maven Central is unreachable from here "
                f"(https://repo.maven.apache.org; a proxy goes in ~/.m2/settings.xml):\n{tail}"
            )
        raise JarsMissing(f"Maven could not resolve the {name} jars:\n{tail}")
    partial.replace(target)  # whole or not at all: a cut fetch leaves no class path behind
    text = _read(target)
    if text is None:
        raise JarsMissing(f"Maven resolved the {name} jars but some are missing from ~/.m2")
    return text


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or list(SETS)
    for name in names:
        try:
            jars = fetch(name).split(os.pathsep)
        except (JarsMissing, ValueError, RuntimeError) as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        print(f"{name}: {len(jars)} jars")
    return 0


if __name__ == "__main__":
    sys.exit(main())
