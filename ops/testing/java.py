"""Java for the tests: find a JDK new enough, and compile small Java programs with javac.

Apache Kafka (the reference broker and its Java client) and Spark need Java 17 or newer.
Every failure says what is missing and how to install it, in one line.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

#: Kafka 4.x brokers and Spark 4 run on Java 17 or newer.
MINIMUM_JAVA = 17
#: What to install on Debian when Java is missing (javac included: tests compile programs).
DEBIAN_JDK = "openjdk-17-jdk-headless"


class JavaMissing(RuntimeError):
    """No usable Java: the message says what was found and what to install."""


def _tool(name: str) -> str:
    """``name`` (java, javac) from ``JAVA_HOME`` if set, else from PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / name).is_file():
        return str(Path(home) / "bin" / name)
    found = shutil.which(name)
    if found is None:
        raise JavaMissing(
            f"{name} not found (JAVA_HOME or PATH): Java {MINIMUM_JAVA}+ is needed "
            f"(Debian: apt-get install {DEBIAN_JDK})"
        )
    return found


def java_version(java: str) -> int:
    """The feature version (17, 21, …) that ``java -version`` reports."""
    output = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    if match is None:
        raise JavaMissing(f"{java} -version printed no version: {output.strip()[:200]!r}")
    major = int(match.group(1))
    # Java 8 and older call themselves 1.x.
    return int(match.group(2) or 0) if major == 1 else major


def require_java() -> str:
    """The ``java`` binary to run, checked to be Java 17 or newer."""
    java = _tool("java")
    version = java_version(java)
    if version < MINIMUM_JAVA:
        raise JavaMissing(
            f"{java} is Java {version}; Java {MINIMUM_JAVA}+ is needed "
            f"(Debian: apt-get install {DEBIAN_JDK}, or set JAVA_HOME)"
        )
    return java


def compile_java(sources: Sequence[Path], classpath: str, output_root: Path) -> Path:
    """Compile ``sources`` against ``classpath`` with javac into a folder below
    ``output_root`` named by the sources' and classpath's digest, and return that folder.
    A folder already compiled from the same inputs is reused."""
    require_java()
    javac = _tool("javac")
    digest = hashlib.sha256(classpath.encode())
    for source in sorted(sources):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    classes = output_root / f"classes-{digest.hexdigest()[:16]}"
    if (classes / ".compiled").exists():
        return classes
    classes.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [javac, "-nowarn", "-cp", classpath, "-d", str(classes), *map(str, sources)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"javac failed:\n{result.stderr[-3000:]}")
    (classes / ".compiled").touch()
    return classes
