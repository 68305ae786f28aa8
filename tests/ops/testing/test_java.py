"""Compiling and running a Java program with the machine's JDK."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ops.testing.java import MINIMUM_JAVA, compile_java, java_version, require_java


def test_java_is_new_enough() -> None:
    assert java_version(require_java()) >= MINIMUM_JAVA


def test_compile_and_run_and_reuse(tmp_path: Path) -> None:
    source = tmp_path / "Hello.java"
    source.write_text(
        "public class Hello { public static void main(String[] a) {"
        ' System.out.println("hello " + a[0]); } }'
    )
    classes = compile_java([source], "", tmp_path / "out")
    run = subprocess.run(
        [require_java(), "-cp", str(classes), "Hello", "pidctl"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout == "hello pidctl\n"
    assert compile_java([source], "", tmp_path / "out") == classes  # same inputs: reused
