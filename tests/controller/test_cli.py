"""The ``pidctl`` command's errors, in process: each is one line and the exit status its
class carries (the subprocess tests in ``tests/e2e/test_cli.py`` run the real command)."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from pidctl.controller.cli import main
from pidctl.controller.core.errors import PidctlError, UsageError
from pidctl.controller.log.datadir import StorageFailed, lock_data_dir
from pidctl.controller.log.formatting import format_data_dir

ROOT = Path(__file__).resolve().parent.parent.parent


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv), environ={})
    out, err = capsys.readouterr()
    return status, out, err


def test_bad_settings_exit_2_with_a_line_per_problem(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "config", "show", "--node-id", "x", "--max-frame-bytes", "0")
    assert status == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and all(line.startswith("pidctl: ") for line in lines)
    assert any("node_id" in line for line in lines)
    assert any("max_frame_bytes" in line for line in lines)


def test_serve_on_a_data_dir_that_is_not_formatted_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = run(capsys, "serve", "--data-dir", str(tmp_path / "none"))
    assert status == 2 and len(err.splitlines()) == 1 and "pidctl format" in err


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0"])  # never a default port
def test_serve_on_a_wildcard_address_needs_an_advertised_listener(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, listen: str
) -> None:
    """A client reconnects to the address pidctl advertises; a wildcard is not one (Kafka
    refuses to advertise 0.0.0.0): one line saying what to set, before anything is made or
    bound."""
    data_dir = tmp_path / "d"
    status, out, err = run(
        capsys, "serve", "--listen", listen, "--data-dir", str(data_dir), "--format-if-missing"
    )
    assert (status, out) == (2, "")
    assert err == (
        f"pidctl: advertised_listener: required when listening on the wildcard address "
        f"{listen} (clients reconnect to the address pidctl advertises, and cannot connect to "
        f"{listen.rsplit(':', 1)[0].strip('[]')}): set --advertised-listener or "
        "PIDCTL_ADVERTISED_LISTENER to the HOST:PORT clients reach, or listen on that host\n"
    )
    assert not data_dir.exists()
    # As a first listener of `listeners` too; an advertised address lets it through to the
    # next check (the data dir is not formatted).
    listeners = f"PLAINTEXT://{listen}"
    status, _, err = run(capsys, "serve", "--listeners", listeners, "--data-dir", str(data_dir))
    assert status == 2 and err.startswith("pidctl: advertised_listener: required")
    status, _, err = run(
        capsys,
        "serve",
        "--listen",
        listen,
        "--advertised-listener",
        "pidctl.example:9093",
        "--data-dir",
        str(data_dir),
    )
    assert status == 2 and "pidctl format" in err


def test_format_twice_refuses_or_is_ignored(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data_dir = str(tmp_path / "data")
    made = run(capsys, "format", "--data-dir", data_dir, "--cluster-id", "c0ffee")
    assert made[0] == 0 and made[1].startswith(f"formatted {data_dir}")
    again = run(capsys, "format", "--data-dir", data_dir)
    assert again == (
        1,
        "",
        f"pidctl: {data_dir} is already formatted (cluster id c0ffee); nothing done\n",
    )
    ignored = run(capsys, "format", "--data-dir", data_dir, "--ignore-formatted")
    assert ignored == (
        0,
        f"{data_dir} is already formatted (cluster id c0ffee); nothing done\n",
        "",
    )


def test_format_refuses_a_missing_parent_unless_asked(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An absolute path with a typo above the data dir is one line and nothing made;
    --parents makes the folders."""
    data_dir = str(tmp_path / "pidtcl" / "data")
    status, out, err = run(capsys, "format", "--data-dir", data_dir)
    assert (status, out) == (1, "")
    assert err == (
        f"pidctl: {tmp_path / 'pidtcl'} does not exist: check the path (a typo, a volume not"
        " mounted), or pass --parents to create it\n"
    )
    assert list(tmp_path.iterdir()) == []
    status, out, _ = run(capsys, "format", "--data-dir", data_dir, "--parents")
    assert status == 0 and out.startswith(f"formatted {data_dir}: cluster id ")


def test_an_offline_command_on_a_locked_data_dir_says_to_stop_the_controller(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    format_data_dir(tmp_path, "c0ffee", 1, 0)
    fd = lock_data_dir(tmp_path)  # flock is per open file: this process's second open waits
    try:
        status, _, err = run(
            capsys, "log", "reserve", "--data-dir", str(tmp_path), "--producer-id", "5"
        )
    finally:
        os.close(fd)
    assert (status, err) == (1, f"pidctl: {tmp_path} is in use: stop the controller first\n")
    status, out, err = run(
        capsys, "log", "reserve", "--data-dir", str(tmp_path), "--producer-id", "5"
    )
    assert status == 0 and err == "" and "reserved up to 5" in out


def test_usage_errors_exit_2_and_corruption_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    negative = run(capsys, "log", "reserve", "--data-dir", str(tmp_path), "--producer-id", "-1")
    assert negative == (2, "", "pidctl: --producer-id must not be negative\n")
    missing = run(
        capsys, "log", "reserve", "--data-dir", str(tmp_path / "none"), "--producer-id", "1"
    )
    assert missing == (1, "", f"pidctl: CORRUPT: {tmp_path / 'none'}: no such data dir\n")
    since = run(capsys, "log", "dump", "--data-dir", str(tmp_path), "--since", "yesterday")
    assert since[0] == 2 and since[2].startswith("pidctl: --since/--until: ")


def test_each_error_class_carries_its_status() -> None:
    assert PidctlError("x").exit_code == 1 and UsageError("x").exit_code == 2
    failed = StorageFailed(Path("/d/0.log"), "fdatasync", OSError(5, "Input/output error"))
    assert failed.exit_code == 74
    assert failed.cli_lines() == [
        "storage failed, stopping: fdatasync of /d/0.log failed: Input/output error"
    ]
    assert PidctlError("one\ntwo").cli_lines() == ["one", "two"]


def test_the_command_line_prints_errors_in_one_place() -> None:
    """Every error line goes through ``_report`` (or is a note, not an error): no command
    prints ``pidctl: ...`` and picks an exit status of its own."""
    tree = ast.parse((ROOT / "controller" / "cli.py").read_text())
    returns = {
        node.value.value
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef) and function.name != "_report"
        for node in ast.walk(function)
        if isinstance(node, ast.Return)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, int)
    }
    assert returns == {0}  # a failing status comes only from the error that carries it


def test_log_reserve_refuses_values_past_the_ranges_last_block(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """2^63-1 was taken (the controller then answered every request with an error), and
    2^63 crashed with a traceback."""
    format_data_dir(tmp_path, "c0ffee", 1, 0)
    for value in (2**63 - 1, 2**63, 2**64, 2**63 - 1000):
        status, out, err = run(
            capsys, "log", "reserve", "--data-dir", str(tmp_path), "--producer-id", str(value)
        )
        assert (status, out) == (2, ""), value
        assert len(err.splitlines()) == 1 and "past the last block of the range" in err
    last_block = 2**63 - 1 - 1000  # the last block [2^63-1001, 2^63-2]
    status, out, _ = run(
        capsys, "log", "reserve", "--data-dir", str(tmp_path), "--producer-id", str(last_block)
    )
    assert status == 0 and f"the next start grants from {last_block}" in out
    # A range ending lower (the controller's last_producer_id): its last block, no further.
    for flag in (["--last-producer-id", "99999"], []):
        environ = {} if flag else {"PIDCTL_LAST_PRODUCER_ID": "99999"}
        argv = ["log", "reserve", "--data-dir", str(tmp_path), "--producer-id", "99001", *flag]
        status = main([*argv, "--force"], environ=environ)
        _, err = capsys.readouterr()
        assert status == 2 and "at most 99000, with last_producer_id 99999" in err


def test_log_reserve_lowers_an_intact_reservation_only_with_force(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """It silently lowered an intact reservation: what a start-up skips to, above grants the
    log's lost tail may have held."""
    from pidctl.controller.log.datadir import read_reservation

    format_data_dir(tmp_path, "c0ffee", 1, 0)
    reserve = ["log", "reserve", "--data-dir", str(tmp_path), "--producer-id"]
    assert run(capsys, *reserve, "50000")[0] == 0
    status, out, err = run(capsys, *reserve, "20000")
    assert (status, out) == (2, "") and "intact reservation up to 50000" in err
    assert read_reservation(tmp_path) == 50000
    assert run(capsys, *reserve, "60000")[0] == 0  # raising it: always
    status, out, _ = run(capsys, *reserve, "20000", "--force")
    assert status == 0 and "reserved up to 20000 (it was 60000" in out
    assert read_reservation(tmp_path) == 20000
