"""Fetching Kafka's jars: a clear line for each way the set-up can fail."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.testing import jars
from ops.testing.coordination import free_port


def test_fetched_set_is_a_class_path_of_existing_jars() -> None:
    entries = jars.classpath("kafka").split(os.pathsep)
    assert any(Path(jar).name.startswith("kafka_2.13-4.") for jar in entries)
    assert any(Path(jar).name.startswith("kafka-clients-4.") for jar in entries)
    assert all(Path(jar).is_file() for jar in entries)


def test_a_set_not_fetched_names_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(jars.JarsMissing, match=r"ops/dev\.sh fetch"):
        jars.classpath("kafka")


def test_unreachable_maven_central_is_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real Maven run, with an empty local repository and every download sent to a
    # loopback port nothing listens on.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    settings = tmp_path / "settings.xml"
    settings.write_text(
        "<settings><mirrors><mirror><id>nowhere</id><mirrorOf>*</mirrorOf>"
        f"<url>http://127.0.0.1:{free_port()}/maven2</url></mirror></mirrors></settings>"
    )
    args = ["-s", str(settings), f"-Dmaven.repo.local={tmp_path / 'm2'}"]
    with pytest.raises(jars.JarsMissing, match="Maven Central is unreachable"):
        jars.fetch("kafka", maven_args=args)
    assert not list((tmp_path / "cache").glob("**/*.classpath"))


def test_no_java_is_one_line_naming_the_package(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path), "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "ops.testing.jars", "kafka"],
        env=env,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[3],
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "java not found" in result.stderr and "openjdk-17-jdk-headless" in result.stderr


def test_unknown_set() -> None:
    assert jars.main(["no-such-set"]) == 1
